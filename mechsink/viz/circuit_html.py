"""An interactive view of an edge circuit as one self-contained HTML file (inline SVG and a few
lines of JavaScript: it opens offline, from ``file://``).

Nodes sit where :func:`mechsink.viz.discover.draw_circuit` puts them (embedding, each layer's
heads, its MLP, the metric); a slider keeps the top N edges by |score|; hovering an edge or a
node names it with its score; colours name the receiving input (query, key, value, MLP, metric),
dashes a negative score.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechsink.io import atomic_write_text
from mechsink.viz.circuit_layout import KIND_COLOURS, _num, _position, mlp_row
from mechsink.viz.html_safe import script_json, text

#: pixels per stage (a layer is two: heads, MLP) and per head row: a 30-layer model fits a page
SCALE_X, SCALE_Y, PAD = 22.0, 26.0, 40.0


def _kind(receiver: str) -> str:
    if receiver == "metric":
        return "metric"
    return "mlp" if receiver.startswith("MLP") else receiver[-1]


def circuit_page(circuit: dict[str, Any], path: str | Path, *, title: str = "") -> Path:
    """Write the interactive view of a circuit dict
    (:meth:`~mechsink.discover.circuit.Circuit.to_dict`) to ``path`` (atomically)."""
    g = circuit["graph"]
    n_heads, n_layers = int(g["n_heads"]), max(1, int(g["n_layers"]))
    group = n_heads // int(g["n_kv_heads"])

    top = max([mlp_row(n_heads)] + [_position(s, n_heads, n_layers, group)[1]
                                    for s in g.get("senders", []) if "N" in s[1:]])

    def xy(name: str) -> tuple[float, float]:  # head 0 at the bottom, as in circuit.png
        x, y = _position(name, n_heads, n_layers, group)
        return PAD + SCALE_X * x, PAD + SCALE_Y * (top - y)

    edges = []
    for e in circuit["edges"]:
        recv, kind = e["receiver"], _kind(e["receiver"])
        (x0, y0) = xy(e["sender"])
        (x1, y1) = xy(recv.split(".")[0] if kind in "qkv" else recv)
        if kind in "qkv":
            x1 -= 0.25 * SCALE_X
        score = e.get("score")
        edges.append({"s": e["sender"], "r": recv, "k": kind, "score": score,
                      "x0": x0, "y0": y0, "x1": x1, "y1": y1})
    order = sorted(range(len(edges)), key=lambda i: -abs(_num(edges[i]["score"], 0.0)))
    for rank, i in enumerate(order):
        edges[i]["rank"] = rank
    nodes = sorted({"embed", "metric"} | {e["s"] for e in edges}
                   | {e["r"].split(".")[0] for e in edges})
    node_xy = {n: xy(n) for n in nodes}
    width = PAD * 2 + SCALE_X * (2 * n_layers + 1) + 60  # room for the last labels
    height = PAD * 2 + SCALE_Y * top
    heading = title or f"{circuit['n_edges']} edges ({circuit['how']})"
    legend = " ".join(f'<span style="color:{c}">&#9644; {k}</span>'
                      for k, c in KIND_COLOURS.items())
    data = script_json({"edges": edges, "nodes": {n: list(p) for n, p in node_xy.items()},
                        "colours": KIND_COLOURS}, allow_nan=False)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{text(heading)}</title>
<style>body{{font-family:sans-serif;margin:1.5em}} svg{{border:1px solid #ddd}}
#tip{{position:fixed;background:#fff;border:1px solid #999;padding:2px 6px;font-size:12px;
display:none;pointer-events:none}}</style></head>
<body><h2>{text(heading)}</h2>
<p>edges shown: <input id="n" type="range" min="1" max="{max(1, len(edges))}"
value="{min(len(edges), 50) or 1}"> <span id="count"></span> (top by |score|) &nbsp; into:
{legend} &nbsp; dashed: negative</p>
<svg id="g" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}"
 style="max-width:100%;height:auto"></svg><div id="tip"></div>
<script>
const D = {data};
const svg = document.getElementById("g"), tip = document.getElementById("tip");
const NS = "http://www.w3.org/2000/svg";
const top1 = Math.max(1e-12, ...D.edges.map(e => Math.abs(e.score || 0)));
function show(text, ev) {{ tip.textContent = text; tip.style.display = "block";
  tip.style.left = (ev.clientX + 12) + "px"; tip.style.top = (ev.clientY + 12) + "px"; }}
function hide() {{ tip.style.display = "none"; }}
function draw() {{
  const n = +document.getElementById("n").value;
  document.getElementById("count").textContent = n + " of " + D.edges.length;
  svg.innerHTML = "";
  const on = new Set();
  for (const e of D.edges) {{
    if (e.rank >= n) continue;
    on.add(e.s); on.add(e.r.split(".")[0]);
    const l = document.createElementNS(NS, "line");
    l.setAttribute("x1", e.x0); l.setAttribute("y1", e.y0);
    l.setAttribute("x2", e.x1); l.setAttribute("y2", e.y1);
    l.setAttribute("stroke", D.colours[e.k]); l.setAttribute("stroke-opacity", 0.9);
    l.setAttribute("stroke-width", 1.2 + 5 * Math.abs(e.score || 0) / top1);
    if ((e.score || 0) < 0) l.setAttribute("stroke-dasharray", "4 3");
    const label = e.s + " \\u2192 " + e.r + ": " + (e.score === null ? "no score" : e.score);
    l.addEventListener("mousemove", ev => show(label, ev)); l.addEventListener("mouseleave", hide);
    svg.appendChild(l);
  }}
  for (const [name, p] of Object.entries(D.nodes)) {{
    const c = document.createElementNS(NS, "circle");
    c.setAttribute("cx", p[0]); c.setAttribute("cy", p[1]);
    c.setAttribute("r", on.has(name) ? 5 : 2.5);
    c.setAttribute("fill", on.has(name) ? "#000" : "#bbb");
    c.addEventListener("mousemove", ev => show(name, ev)); c.addEventListener("mouseleave", hide);
    svg.appendChild(c);
    if (on.has(name)) {{ const t = document.createElementNS(NS, "text");
      t.setAttribute("x", p[0] + 5); t.setAttribute("y", p[1] - 5);
      t.setAttribute("transform", "rotate(-35 " + (p[0] + 5) + " " + (p[1] - 5) + ")");
      t.setAttribute("font-size", "11"); t.textContent = name; svg.appendChild(t); }}
  }}
}}
document.getElementById("n").addEventListener("input", draw);
draw();
</script></body></html>
"""
    return atomic_write_text(Path(path), page)
