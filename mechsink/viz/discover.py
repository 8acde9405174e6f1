"""Static figures of edge circuits and faithfulness curves, drawn from their JSON dicts (never
from a model; matplotlib only, so they work offline).

:func:`draw_circuit`: nodes by layer (embedding, each layer's heads, its MLP, the metric),
an edge per kept edge, width by |score|, colour by the receiving input (query, key, value,
MLP, metric), dashed when the score is negative. :func:`draw_curves`: faithfulness against
edges kept per ablation, each with its random-circuit band. :func:`draw_discovery`: both,
from a folder :meth:`mechsink.discover.Discovery.save` wrote.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from mechsink.viz.circuit_layout import KIND_COLOURS, _num, _position, mlp_row


def draw_circuit(circuit: dict[str, Any], path: str | Path, *, title: str = "",
                 max_edges: int = 200) -> Path:
    """Draw a circuit dict (:meth:`~mechsink.discover.circuit.Circuit.to_dict`) into ``path``."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from mechsink.viz.style import MIN_FONT, PAGE_WIDTH, save, styled

    g = circuit["graph"]
    n_heads, n_layers = int(g["n_heads"]), max(1, int(g["n_layers"]))
    group = n_heads // int(g["n_kv_heads"])
    edges = circuit["edges"][:max_edges]
    scores = [abs(_num(e.get("score", 1.0), 0.0)) for e in edges] or [1.0]
    top = max(scores) or 1.0
    with styled():
        fig, ax = plt.subplots(figsize=(PAGE_WIDTH, max(3.0, 0.3 * n_heads + 1.8)),
                               layout="constrained")
        used: set[str] = set()
        for e in edges:
            recv = e["receiver"]
            kind = "metric" if recv == "metric" else ("mlp" if recv.startswith("MLP")
                                                     else recv[-1])
            x0, y0 = _position(e["sender"], n_heads, n_layers, group)
            x1, y1 = _position(recv.split(".")[0] if kind in "qkv" else recv, n_heads,
                               n_layers, group)
            if kind in "qkv":  # the receiving head reads at its left edge
                x1 -= 0.25
            s = _num(e.get("score", 1.0), 0.0)  # null: an edge without a score
            ax.plot([x0, x1], [y0, y1], color=KIND_COLOURS[kind], alpha=0.75,
                    linewidth=0.5 + 3.5 * abs(s) / top, linestyle="-" if s >= 0 else "--",
                    label=kind if kind not in used else None, zorder=1)
            used.add(kind)
        nodes = {"embed", "metric"} | {f"L{lay}H{h}" for lay in range(n_layers)
                                       for h in range(n_heads)}
        nodes |= {s for s in g["senders"] if s.startswith("MLP")}
        active = {e["sender"] for e in edges} | {e["receiver"].split(".")[0] for e in edges}
        for name in nodes:
            x, y = _position(name, n_heads, n_layers, group)
            on = name in active
            ax.scatter([x], [y], s=28 if on else 8, color="#000000" if on else "#BBBBBB",
                       zorder=2)
            if on:  # slanted, so the labels of neighbouring layers do not run together
                ax.annotate(name, (x, y), fontsize=MIN_FONT, xytext=(3, 3), rotation=35,
                            textcoords="offset points", ha="left", va="bottom")
        ticks = [0] + [2 * lay + 1 for lay in range(n_layers)] + [2 * n_layers + 1]
        ax.set_xticks(ticks, ["embed"] + [f"L{lay}" for lay in range(n_layers)] + ["metric"],
                      fontsize=MIN_FONT, rotation=90 if n_layers > 8 else 0)
        ax.set_xlim(-1.0, 2 * n_layers + 2.5)  # room for the first and last labels
        top_row = max([mlp_row(n_heads)] + [_position(s, n_heads, n_layers, group)[1]
                                             for s in g.get("senders", []) if "N" in s[1:]])
        ax.set_ylim(-0.7, top_row + 1.2)
        ax.set_yticks([*range(n_heads), mlp_row(n_heads)],
                      [f"H{h}" for h in range(n_heads)] + ["MLP"])
        ax.set_ylabel("head / MLP")
        handles, labels = ax.get_legend_handles_labels()
        handles.append(Line2D([], [], color="#555555", lw=4.0))
        labels.append(f"widest line: |score| {top:.3g} (width by |score|)")
        handles.append(Line2D([], [], color="#555555", lw=1.0, ls="--"))
        labels.append("dashed: negative score")
        ax.legend(handles, labels, title="into", loc="upper center", frameon=False,
                  bbox_to_anchor=(0.5, -0.12 if n_layers <= 8 else -0.2), ncol=4)
        faith = circuit.get("faithfulness")
        extra = "" if faith is None or (isinstance(faith, float) and math.isnan(faith)) \
            else f", faithfulness {faith:.2f}"
        ax.set_title(title or f"{circuit['n_edges']} edges ({circuit['how']}{extra})")
        return Path(save(fig, Path(path)))


def draw_curves(curves: list[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Faithfulness against edges kept: one panel per ablation, every ranking in it, each with
    its random baseline (mean +- one standard deviation)."""
    import matplotlib.pyplot as plt

    from mechsink.viz.style import PAGE_WIDTH, PALETTE, save, styled

    # JSON writes undefined values as null: NaN here (a gap in the line)
    curves = [{**c, **{k: [_num(v) for v in c[k]] for k in ("values", "random_mean",
                                                            "random_std")},
               "auc": _num(c["auc"]), "random_auc": _num(c["random_auc"])} for c in curves]
    ablations = list(dict.fromkeys(c["ablation"] for c in curves))
    labels = list(dict.fromkeys(c["label"] for c in curves))
    with styled():
        fig, axes = plt.subplots(1, len(ablations), figsize=(PAGE_WIDTH, 3.6), squeeze=False,
                                 layout="constrained")
        for ax, abl in zip(axes[0], ablations, strict=True):
            ax.set_title(abl)
            mine = [c for c in curves if c["ablation"] == abl]
            if not any(math.isfinite(v) for c in mine for v in c["values"]):
                ax.text(0.5, 0.5, "nothing to explain:\nclean = everything ablated",
                        ha="center", va="center", transform=ax.transAxes)
                continue
            for c in mine:
                colour = PALETTE[labels.index(c["label"]) % len(PALETTE)]
                x = [max(s, 0.5) for s in c["sizes"]]
                ax.plot(x, c["values"], marker="o", color=colour,
                        label=f"{c['label']} (AUC {c['auc']:.2f})")
                lo = [m - s for m, s in zip(c["random_mean"], c["random_std"], strict=True)]
                hi = [m + s for m, s in zip(c["random_mean"], c["random_std"], strict=True)]
                ax.plot(x, c["random_mean"], color=colour, linestyle=":", linewidth=1,
                        label=f"random (AUC {c['random_auc']:.2f})")
                ax.fill_between(x, lo, hi, color=colour, alpha=0.12, linewidth=0)
            ax.axhline(1.0, color="#999999", linewidth=0.6)
            ax.axhline(0.0, color="#999999", linewidth=0.6)
            ax.set_xscale("log")
            ax.set_xlabel("edges kept (0 drawn at 0.5)")
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
        axes[0][0].set_ylabel("normalised metric")
        if title:
            fig.suptitle(title)
        return Path(save(fig, Path(path)))


def draw_discovery(folder: str | Path) -> list[Path]:
    """``circuit.png``, ``circuit.html`` (interactive, offline) and (when there are curves)
    ``faithfulness.png`` in ``folder``, drawn
    from the ``discover.json`` :meth:`mechsink.discover.Discovery.save` wrote there."""
    import json

    folder = Path(folder)
    data = json.loads((folder / "discover.json").read_text(encoding="utf-8"))
    from mechsink.viz.circuit_html import circuit_page

    out = [draw_circuit(data["circuit"], folder / "circuit.png"),
           circuit_page(data["circuit"], folder / "circuit.html")]
    if data["curves"]:
        out.append(draw_curves(data["curves"], folder / "faithfulness.png"))
    return out
