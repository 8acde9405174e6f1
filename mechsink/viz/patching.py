"""The heatmap of a patching result, drawn from the saved JSON (or a :class:`PatchResult`).

Rows are every axis but the position-like one (flattened), columns are positions; colours show
each patch's effect (value minus the unpatched run input's metric; normalised results as they
are) on a diverging scale centred on zero (:data:`mechsink.viz.style.SIGNED_CMAP`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mechsink.viz.style import SIGNED_CMAP, styled


def _as_result(result: Any) -> Any:
    from mechsink.patching.result import PatchResult

    if isinstance(result, (str, Path)):
        return PatchResult.from_json(result)
    return result


def heatmap(result: Any, ax: Any = None) -> Any:
    """A matplotlib figure of a patching result: a ``PatchResult`` or the path of its JSON
    (``PatchResult.to_json``). 1-axis results are drawn as a single row; the title names the
    site, the metric and the clean/corrupted metric values."""
    import matplotlib.pyplot as plt

    result = _as_result(result)
    axes = list(result.axes)
    col_axis = next((a for a in ("pos", "dest_pos", "src_pos") if a in axes), axes[-1])
    if len(axes) == 1:
        col_axis = axes[0]
    order = [a for a in axes if a != col_axis] + [col_axis]
    vals = result.values.permute(*[axes.index(a) for a in order]).reshape(
        -1, len(result.labels[col_axis])).to(torch.float32)
    row_axes = order[:-1]
    rows = [""] if not row_axes else _row_labels(result, row_axes)
    cols = [str(v) for v in result.labels[col_axis]]
    if col_axis in ("pos", "dest_pos", "src_pos") and result.tokens:
        cols = [f"{p}:{result.tokens[p]!r}" for p in result.labels[col_axis]]
    with styled():
        if ax is None:
            size = (max(4, 0.45 * len(cols) + 2), max(2, 0.25 * len(rows) + 1.5))
            fig, ax = plt.subplots(figsize=size)
        else:
            fig = ax.figure
        base, what = _baseline(result)
        vals = vals - base
        lim = float(vals.abs().max()) or 1.0
        im = ax.imshow(vals.numpy(), cmap=SIGNED_CMAP, vmin=-lim, vmax=lim, aspect="auto")
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.set_xlabel(col_axis)
        ax.set_ylabel(" x ".join(row_axes))
        other = ("ablated" if result.corrupted_value is None
                 else f"corrupted {result.corrupted_value:.3g}")
        ax.set_title(f"{result.site}: {result.metric} (clean {result.clean_value:.3g}, {other})",
                     fontsize=9)
        fig.colorbar(im, ax=ax, label=f"{result.metric} {what}")
        fig.tight_layout()
    return fig


def _row_labels(result: Any, row_axes: list[str]) -> list[str]:
    short = {"layer": "L", "head": "H", "neuron": "N", "pos": "P", "dest_pos": "D", "src_pos": "S"}
    labels = [""]
    for a in row_axes:
        labels = [f"{p}{short.get(a, a)}{v}" for p in labels for v in result.labels[a]]
    return labels


def _baseline(result: Any) -> tuple[float, str]:
    """What to subtract so colours show effects: the run input's metric (0 if normalised)."""
    if result.meta.get("normalized"):
        return 0.0, "(0 = run input, 1 = source)"
    if result.meta.get("direction", "denoise") == "noise":
        return float(result.clean_value), "- clean"
    return float(result.corrupted_value), "- corrupted"
