"""Markdown tables and numbers for the pages, made from the results' JSON (never typed in)."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

from docs.build.cache import slug


def fmt(x: Any, digits: int = 3) -> str:
    """A number as the pages print it (``-`` for a missing value)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x != 0 and (abs(x) >= 10 ** 6 or abs(x) < 10 ** -3):
            return f"{x:.{digits}g}"
        if abs(x) >= 100:
            return f"{x:.0f}"
        return f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return str(x)


def run_of(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The census run called ``suite/variant`` (the first run if absent)."""
    return next((r for r in data["runs"] if r["name"] == name), data["runs"][0])


def sink_rate_table(data: Mapping[str, Any]) -> str:
    """Markdown table: sink rate per suite (rows) and first-token variant (columns)."""
    suites, variants = data["settings"]["suites"], data["settings"]["variants"]
    head = "| input | " + " | ".join(variants) + " |\n|---|" + "---|" * len(variants) + "\n"
    rows = []
    for s in suites:
        cells = []
        for v in variants:
            r = next((r for r in data["runs"] if r["suite"] == s and r["variant"] == v), None)
            cells.append("-" if r is None else
                         f"{fmt(r['sink_rate'])} ({fmt(r['sink_rate_no_self'])})")
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
    return head + "\n".join(rows) + "\n"


def massive_table(data: Mapping[str, Any], run: str, k: int = 5, median: str = "token") -> str:
    """The ``k`` largest massive activations of a run; ``median="token"`` (the median of the
    token's own channels) or ``"layer"`` (of the whole layer, Sun et al.'s code)."""
    r = run_of(data, run)
    key = "massive_activations" if median == "token" else "massive_activations_layer_median"
    items = sorted(r[key], key=lambda m: -abs(m["max_abs"]))[:k]
    if not items:
        return (f"*No massive activations on {r['name']} with the {median} median "
                f"({len(r[key])} entries).*\n")
    lines = ["| layer | position | channel | mean value | x median | max abs | sequences |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {m['layer']} | {m['position']} | {m['channel']} | {fmt(m['value'])} | "
              f"{fmt(m['ratio_to_median'])} | {fmt(m['max_abs'])} | {m['count']} |"
              for m in items]
    return "\n".join(lines) + "\n"


def super_neuron_table(data: Mapping[str, Any], run: str, k: int = 6) -> str:
    r = run_of(data, run)
    items = sorted(r["super_neurons"], key=lambda m: -abs(m["activation"]))[:k]
    if not items:
        return f"*No super neurons on {r['name']}.*\n"
    lines = ["| layer | neuron | channel | position | activation | super weight | MLP output | "
             "sequences |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {m['layer']} | {m['neuron']} | {m['channel']} | {m['position']} | "
              f"{fmt(m['activation'])} | {fmt(m['weight'])} | {fmt(m['output'])} | {m['count']} |"
              for m in items]
    return "\n".join(lines) + "\n"


def norm_ratio_table(data: Mapping[str, Any]) -> str:
    lines = ["| input | largest ratio | at layer | ratio after the last layer |",
             "|---|---|---|---|"]
    for r in data["runs"]:
        vals = [v for v in r["first_token_norm_ratio"] if v is not None]
        if not vals:
            continue
        best = max(vals)
        lines.append(f"| {r['name']} | {fmt(best)} | {r['first_token_norm_ratio'].index(best)} "
                     f"| {fmt(r['first_token_norm_ratio'][-1])} |")
    return "\n".join(lines) + "\n"


def variance_table(data: Mapping[str, Any]) -> str:
    lines = ["| input | Var(pos 0)/Var(pos>0), layer 0 | median over layers | "
             "uniform-mixing prediction, layer 0 |", "|---|---|---|---|"]
    for r in data["runs"]:
        if r["variant"] != "randfirst":
            continue
        vd = r["variance_discrepancy"]
        ratios = sorted(v for v in vd["ratio"] if v is not None)
        med = ratios[len(ratios) // 2] if ratios else None
        lines.append(f"| {r['name']} | {fmt(vd['ratio'][0])} | {fmt(med)} | "
                     f"{fmt(vd['predicted_ratio'][0])} |")
    return "\n".join(lines) + "\n"


def path_table(results: Mapping[str, Mapping[str, Any]], k: int = 8) -> str:
    """Markdown table of path-patching effects (value - clean value) per sender, one column per
    result (``path_recomputed``, ``path_frozen``), largest drop under the first one first."""
    names = sorted(results, key=lambda n: (n != "path_recomputed", n))  # the model's own first
    first = results[names[0]]
    senders = first["labels"][first["axes"][0]]
    effects = {n: dict(zip(r["labels"][r["axes"][0]],
                           (v - r["clean_value"] for v in r["values"]), strict=True))
               for n, r in results.items()}
    order = sorted(senders, key=lambda s: effects[names[0]][s])[:k]
    head = "| sender | " + " | ".join(n.replace("path_", "scales = ") for n in names) + " |"
    lines = [head, "|---|" + "---|" * len(names)]
    lines += [f"| `{s}` | " + " | ".join(f"{effects[n][s]:+.4f}" for n in names) + " |"
              for s in order]
    return "\n".join(lines) + "\n"


def settings_line(data: Mapping[str, Any]) -> str:
    s = data["settings"]
    return (f"`{data['model']}`, n = {s['n']} sequences of T = {s['seq_len']} tokens per input "
            f"(suites {', '.join(s['suites'])}; first token {', '.join(s['variants'])}), "
            f"seed {s['seed']}, eps = {s['eps']}, {s['dtype']} on {s['device']}")


#: Markdown's link, image and attribute-list brackets, escaped in :func:`plain`
_MARKDOWN_BRACKETS = str.maketrans({c: f"\\{c}" for c in "[]{}"})
_CODE_SPAN = re.compile(r"(`+).+?\1")


def plain(text: Any) -> str:
    """Text read from a result file, made inert for a Markdown page: HTML markup, links and
    attribute lists in it are shown, not run (a result folder may come from anyone)."""
    return html.escape(str(text), quote=False).translate(_MARKDOWN_BRACKETS)


def inert_line(line: str) -> str:
    """A Markdown line with :func:`plain` applied to its text and its code spans kept."""
    out, last = [], 0
    for m in _CODE_SPAN.finditer(line):
        out += [plain(line[last:m.start()]), m.group(0)]
        last = m.end()
    return "".join([*out, plain(line[last:])])


def summary_body(md: str) -> str:
    """A circuits ``summary.md`` without its title and image lines (the page has its own), its
    text made inert (:func:`inert_line`: an experiment's summary quotes strings of its result
    file, and an imported result may come from anyone; code blocks are kept as they are)."""
    lines: list[str] = []
    fenced = False
    for line in md.splitlines():
        if line.startswith(("# ", "![")):
            continue
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            line = inert_line(line)
        if line.startswith("|"):
            if lines and lines[-1].strip() and not lines[-1].startswith("|"):
                lines.append("")  # a Markdown table needs a blank line before it
            line = escape_cell_pipes(line)
        lines.append(line)
    return "\n".join(lines).strip() + "\n"


def escape_cell_pipes(row: str) -> str:
    """Escape the pipes of ``|x|`` inside the cells of a Markdown table row (a column separator
    has whitespace or the line's end on both sides); separator rows are left alone."""
    if re.fullmatch(r"[\s|:-]+", row):
        return row
    return re.sub(r"(?<!\\)\|", lambda m: "|" if _is_separator(row, m.start()) else "\\|", row)


def _is_separator(row: str, i: int) -> bool:
    before = i == 0 or row[i - 1].isspace()
    after = i == len(row) - 1 or row[i + 1].isspace()
    return before and after


def cli_options(settings: Mapping[str, Any]) -> str:
    """An experiment's settings as the options ``mechsink experiment`` takes (``--seq-len 32``)."""
    parts = []
    for key, value in settings.items():
        values = value if isinstance(value, list | tuple) else [value]
        parts.append(" ".join(["--" + key.replace("_", "-"), *map(str, values)]))
    return " ".join(parts)


def helpers() -> dict[str, Any]:
    """What the page templates may call."""
    return {"fmt": fmt, "run_of": run_of, "sink_rate_table": sink_rate_table,
            "massive_table": massive_table, "super_neuron_table": super_neuron_table,
            "norm_ratio_table": norm_ratio_table, "variance_table": variance_table,
            "settings_line": settings_line, "slug": slug, "path_table": path_table,
            "cli_options": cli_options}


_BLOCK_START = ("#", "-", "*", "+", ">", "```", "!!!", "???", "<", "![")


def caption_tables(md: str) -> str:
    """Give every Markdown table of ``md`` a caption line ("Table: ..."): a table right after
    a paragraph takes that paragraph (which says what the table holds) as its caption, marked;
    one after a heading gets "Table: <the heading>."; one after another table or nothing,
    "Table: columns <its column names>.".
    Indented tables (in admonitions and folds) keep their indentation."""
    lines = md.split("\n")
    out: list[str] = []
    fenced = False
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
        is_head = (not fenced and stripped.startswith("|") and i + 1 < len(lines)
                   and re.fullmatch(r"\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?",
                                    lines[i + 1].strip()) is not None
                   and not (out and out[-1].strip().startswith("|")))
        if is_head:
            _caption(out, line[: len(line) - len(line.lstrip())], line)
        out.append(line)
    return "\n".join(out)


def _caption(out: list[str], indent: str, header: str) -> None:
    """Mark or add the caption of a table (``header``: its first row) about to be appended to
    ``out``."""
    cells = [c.strip() for c in header.strip().strip("|").split("|")]
    columns = ", ".join(f"*{c}*" for c in cells if c) + "."
    j = len(out) - 1
    while j >= 0 and not out[j].strip():
        j -= 1
    prev = out[j].strip() if j >= 0 else ""
    if prev and not prev.startswith((*_BLOCK_START, "|")) and j >= 0:
        start = j  # the first line of that paragraph
        while start > 0 and out[start - 1].strip() and not out[start - 1].strip().startswith(
                _BLOCK_START) and not out[start - 1].strip().startswith("|"):
            start -= 1
        first = out[start]
        if first.strip().lstrip("*_").startswith("Table"):
            return
        lead = first[: len(first) - len(first.lstrip())]
        out[start] = f"{lead}Table: {first.lstrip()}"
        if j == len(out) - 1:
            out.append("")
        return
    title = prev.lstrip("#").strip() if prev.startswith("#") else ""
    title = re.sub(r"\s*\{[^}]*\}\s*$", "", title)  # an attribute list ({ #id })
    if out and out[-1].strip():
        out.append("")
    out += [f"{indent}Table: {title.rstrip('.') + '.' if title else 'columns ' + columns}", ""]
