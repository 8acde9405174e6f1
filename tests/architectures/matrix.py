"""The README's support matrix, generated from the architecture suite.

``python -m tests.architectures.matrix [OUT.md]`` runs ``tests/architectures`` once with every
xfail run as a normal test (``--runxfail``), reads the JUnit report (each test records its
largest relative difference as the ``diff`` property) and writes one Markdown row per
architecture: the largest difference of each check, or the first line of why it fails. The
TransformerLens and transformers versions go in the heading.
"""

from __future__ import annotations

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
}


def run_suite(report: Path) -> None:
    """Run the suite, xfails included as normal tests, writing a JUnit report."""
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "--runxfail", "--tb=no", f"--junitxml={report}",
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
            text = re.sub(r"^(Failed: |mechsink\.errors\.|AssertionError: assert )", "", text)
            cell = f"✗ {text[:90]}".replace("|", "\\|")
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
            "relative to its largest magnitude (≤ 1e-4 passes), or why the check fails.\n\n")
    cols = list(COLUMNS.values())
    lines = ["| architecture | " + " | ".join(cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for arch in sorted(rows):
        lines.append(f"| {arch} | " + " | ".join(rows[arch].get(c, "") for c in cols) + " |")
    return head + "\n".join(lines) + "\n"


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "suite.xml"
        run_suite(report)
        text = markdown(cells(report))
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text, encoding="utf-8")
    else:
        print(text)


if __name__ == "__main__":
    main()
