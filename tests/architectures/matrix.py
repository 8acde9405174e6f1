"""The support matrix of the docs (docs/reference/architectures.md), generated from the
architecture suite.

``python -m tests.architectures.matrix [--junit REPORT.xml] [--docs | OUT.md]`` (``--help``) runs
``tests/architectures`` once with every xfail run as a normal test (``--runxfail``; or reads a
JUnit report of such a run), takes each test's largest relative difference (its ``diff``
property) and writes one Markdown row per architecture: the largest difference of each check,
or the first line of why it fails, with the TransformerLens and transformers versions. With
``--docs`` the table replaces the one between the docs page's ``support-matrix`` markers.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

COLUMNS = {
    "logits_hf_folder": "logits (hf:)", "logits_wrap": "logits (wrap)",
    "engine_unembed_equals_logits": "unembed", "run_from_layer_uses_the_residual":
    "start_at_layer", "census_equals_hand_computation": "census",
    "activation_patching_equals_transformer_lens": "activation",
    "builtin_logit_metric_equals_plain_callable": "LogitDiff",
    "path_patching_equals_hand_reference": "path", "exact_edges_equal_path_patching":
    "discovery", "interventions_equal_hand_edits": "interventions",
    "qkv_equal_transformers": "q/k/v", "rotated_key_edit_equals_transformers": "q/k/v",
    "parallel_block_sites_equal_plain_hooks": "parallel block",
    "bfloat16_logits_and_census_sinks_within_the_stated_tolerance": "bf16",
}


def run_suite(report: Path) -> None:
    """Run the suite, xfails included as normal tests, writing a JUnit report."""
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--runxfail", "--tb=no", "-o", "junit_family=legacy",
                    f"--junitxml={report}",
                    str(Path(__file__).parent)], check=False)


def cells(report: Path) -> dict[str, dict[str, str]]:
    """arch -> column -> cell (the largest difference, or the failure's first line)."""
    table: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for case in ET.parse(report).iter("testcase"):
        m = re.match(r"test_(\w+)\[(.*)\]", case.get("name", ""))
        if not m or m.group(1) not in COLUMNS:
            continue
        arch = m.group(2).split("-")[-1]
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        failure = case.find("failure")
        if failure is None:
            failure = case.find("error")
        if failure is not None:
            text = (failure.get("message") or "failed").splitlines()[0]
            text = re.sub(r"^(Failed: |mechsink\.errors\.|jaxtyping\.|AssertionError: assert )",
                          "", text)
            cell = f"✗ {text[:80]}".replace("|", "\\|")
        else:
            cell = f"{float(props.get('diff', 0.0)):.0e}"
        table[arch][COLUMNS[m.group(1)]].append(cell)
    out: dict[str, dict[str, str]] = {}
    for arch, cols in table.items():
        row = {}
        for col, vals in cols.items():
            bad = [v for v in vals if v.startswith("✗")]
            row[col] = bad[0] if bad else max(vals, key=float)
        out[arch] = row
    return out


def markdown(rows: dict[str, dict[str, str]]) -> str:
    head = (f"Made with TransformerLens {md.version('transformer-lens')} and transformers "
            f"{md.version('transformers')}: the largest difference from the reference, "
            "relative to its largest magnitude (≤ 1e-4 passes), or why the check fails; – where "
            "the check does not apply (parallel block: only models with parallel attention + "
            "MLP); bf16: the model loaded in bfloat16 against transformers in float32, the "
            "larger of the logits' difference (relative) and the census sink scores' (absolute), "
            "within the tolerances stated under Precision (0.05 and 0.005).\n\n")
    cols = list(dict.fromkeys(COLUMNS.values()))
    lines = ["| architecture | " + " | ".join(cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for arch in sorted(rows):
        row = [rows[arch].get(c, "–") for c in cols]
        applies = [c for c in row if c != "–"]
        if len(set(applies)) == 1 and applies[0].startswith("✗"):  # one cause for every check
            first = row.index(applies[0])
            row = [c if c == "–" or i == first else "✗ (same)" for i, c in enumerate(row)]
        lines.append(f"| {arch} | " + " | ".join(row) + " |")
    return head + "\n".join(lines) + "\n"


PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "architectures.md"
MARKERS = ("<!-- support-matrix -->\n", "<!-- /support-matrix -->")


def into_page(text: str) -> None:
    """Replace the table between the docs page's markers."""
    page = PAGE.read_text(encoding="utf-8")
    start, end = page.index(MARKERS[0]) + len(MARKERS[0]), page.index(MARKERS[1])
    PAGE.write_text(page[:start] + text + page[end:], encoding="utf-8")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line: where the table goes and whether to run the suite."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.architectures.matrix",
        description="Run the architecture suite (xfails as normal tests) and write its "
                    "support matrix as Markdown: to OUT.md, into the docs page (--docs) or "
                    "to stdout.")
    parser.add_argument("out", nargs="?", type=Path, default=None, metavar="OUT.md",
                        help="file to write the table to (default: print it)")
    parser.add_argument("--docs", action="store_true",
                        help="replace the table between the support-matrix markers of "
                             "docs/reference/architectures.md")
    parser.add_argument("--junit", type=Path, default=None, metavar="REPORT.xml",
                        help="read this JUnit report of a --runxfail run instead of running "
                             "the suite")
    args = parser.parse_args(argv)
    if args.out is not None and str(args.out).startswith("-"):
        parser.error(f"output path {str(args.out)!r} starts with '-': it looks like an "
                     f"option; write ./{args.out} to mean a file.")
    if args.out is not None and args.docs:
        parser.error("give OUT.md or --docs, not both.")
    if args.junit is not None and not args.junit.is_file():
        parser.error(f"--junit {args.junit}: no such file.")
    return args


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        junit = args.junit
        if junit is None:
            junit = Path(tmp) / "suite.xml"
            run_suite(junit)
        text = markdown(cells(junit))
    if args.docs:
        into_page(text)
    elif args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    else:
        print(text)

if __name__ == "__main__":
    main(sys.argv[1:])
