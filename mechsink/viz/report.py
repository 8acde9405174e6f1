"""The census report folder: figures, the attention page and ``index.html`` tying them together.

Everything is made from the census.json data (no model, no recomputation) and opens offline.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mechsink.io import atomic_write_text
from mechsink.viz.attention import write_attention_page
from mechsink.viz.figures import not_drawn, write_figures
from mechsink.viz.html_safe import text

ATTENTION_PAGE = "attention.html"
INDEX = "index.html"


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.3g}"
    return text(x)


def _massive_cell(m: Mapping[str, Any]) -> str:
    if not m["count"]:
        return "none"
    layers = m["layers"]
    return (f"{_fmt(m['count'])} ({_fmt(m['at_position_0'])} at pos 0); channels "
            f"{', '.join(map(_fmt, m['channels'][:6]))}{'…' if len(m['channels']) > 6 else ''}; "
            f"layers {_fmt(layers[0])}–{_fmt(layers[1])}; max {_fmt(m['max_abs'])}")


def summary_table(data: Mapping[str, Any]) -> str:
    from mechsink.measure.census import summary_rows

    head = ("<tr><th>input</th><th>sink rate (Gu)</th><th>sink rate (i&gt;0)</th>"
            "<th>massive (token median)</th><th>massive (layer median)</th>"
            "<th>super neurons (layer, neuron → channel)</th>"
            "<th>first-token norm ratio</th></tr>")
    rows = []
    for r in summary_rows(data):
        sn = "; ".join(f"L{layer} n{n}→c{c}" for layer, n, c in r["super_neurons"]) or "none"
        ratio = r["norm_ratio_range"]
        rows.append(
            f"<tr><td>{_fmt(r['run'])}</td><td>{_fmt(r['sink_rate'])}</td>"
            f"<td>{_fmt(r['sink_rate_no_self'])}</td><td>{_massive_cell(r['massive'])}</td>"
            f"<td>{_massive_cell(r['massive_layer_median'])}</td><td>{text(sn)}</td>"
            f"<td>{_fmt(ratio[0]) if ratio else '–'} … {_fmt(ratio[1]) if ratio else '–'}</td></tr>"
        )
    return f"<table>\n{head}\n" + "\n".join(rows) + "\n</table>"


def index_page(data: Mapping[str, Any], figures: list[str],
               skipped: Mapping[str, str] | None = None) -> str:
    """The report's index: settings, summary table, figures, and the figures not drawn
    (``skipped``: name -> why)."""
    s = data["settings"]
    arch = data["architecture"]
    title = text(f"mechsink census: {data['model']}")
    figs = "\n".join(f'<figure><img src="{text(f)}" alt="{text(f)}">'
                     f"<figcaption>{text(f)}</figcaption></figure>" for f in figures)
    if skipped:
        figs += "\n<p>Not drawn for this model:</p>\n<ul>\n" + "\n".join(
            f"<li>{text(name)}: {text(why)}</li>" for name, why in skipped.items()) + "\n</ul>"
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
body{{font-family:sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;font-size:90%}} td,th{{border:1px solid #ccc;padding:4px 8px}}
img{{max-width:100%}} figure{{margin:1.5em 0}} code{{background:#f4f4f4}}
</style></head><body>
<h1>{title}</h1>
<p>{_fmt(arch.get('architecture'))}: {_fmt(arch.get('n_layers'))} layers,
{_fmt(arch.get('n_heads'))} heads ({_fmt(arch.get('n_kv_heads'))} KV), d_model
{_fmt(arch.get('d_model'))}, {_fmt(arch.get('n_params'))} parameters. Inputs: suites
{text(', '.join(map(str, s['suites'])))} x first-token variants
{text(', '.join(map(str, s['variants'])))}; n={_fmt(s['n'])} sequences of T={_fmt(s['seq_len'])}
tokens each, seed {_fmt(s['seed'])}; sink threshold eps={text(s['eps'])}; {text(s['dtype'])} on
{text(s['device'])}.</p>
<p>Data: <a href="census.json">census.json</a> (schema <code>{text(data['schema'])}</code>).
Attention patterns of the strongest sink heads: <a href="{ATTENTION_PAGE}">{ATTENTION_PAGE}</a>
(works offline).</p>
<h2>Summary</h2>
{summary_table(data)}
<p>Massive: |x| &gt; 100 and &ge; 1000 x the median |x| of the token or of the whole
layer (Sun et al.'s code), on the residual stream after each block. Super neuron: down-projection
input and MLP output both &gt; 50 at the same position (Yu et al.).</p>
<h2>Figures</h2>
{figs}
</body></html>
"""


def write_report(data: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """Write figures, ``attention.html`` and ``index.html`` into ``out_dir``; return the paths."""
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    figures = write_figures(data, folder)
    attention = write_attention_page(data, folder / ATTENTION_PAGE)
    index = folder / INDEX
    atomic_write_text(index, index_page(data, [f.name for f in figures], not_drawn(data)))
    return [*figures, attention, index]
