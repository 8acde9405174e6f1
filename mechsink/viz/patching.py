"""The heatmap of a patching result, drawn from the saved JSON (or a :class:`PatchResult`).

Rows are every axis but the position-like one (flattened), columns are positions; colours show
each patch's effect (value minus the unpatched run input's metric; normalised results as they
are) on a diverging scale centred on zero (:data:`mechsink.viz.style.SIGNED_CMAP`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mechsink.viz.style import SCORE_CMAP, SIGNED_CMAP, styled


def _as_result(result: Any) -> Any:
    from mechsink.patching.result import PatchResult

    if isinstance(result, (str, Path)):
        return PatchResult.from_json(result)
    return result


def heatmap(result: Any, ax: Any = None, *, raw: bool = False, title: str | None = None) -> Any:
    """A matplotlib figure of a patching result: a ``PatchResult`` or the path of its JSON
    (``PatchResult.to_json``). 1-axis results are drawn as a single row.

    Colours show each patch's effect (value minus the run input's metric) on a scale centred
    on zero; ``raw=True`` shows the values themselves on a sequential scale. The title (or
    ``title``) names the site, the metric, the direction and the two baselines, wrapped to the
    figure's width."""
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
        cols = [f"{p}:{_short(repr(result.tokens[p]), 12)}" for p in result.labels[col_axis]]
    with styled():
        if ax is None:
            size = (min(16, max(4.5, 0.45 * len(cols) + 2)), min(14, max(2.5, 0.25 * len(rows)
                                                                        + 1.8)))
            fig, ax = plt.subplots(figsize=size)
        else:
            fig = ax.figure
        metric = _short(result.metric, 32)
        if raw:
            im = ax.imshow(vals.numpy(), cmap=SCORE_CMAP, aspect="auto")
            bar_label = metric + (" (0 = run input, 1 = source)"
                                  if result.meta.get("normalized") else "")
        else:
            base, what = _baseline(result)
            vals = vals - base
            lim = float(vals.abs().max()) or 1.0
            im = ax.imshow(vals.numpy(), cmap=SIGNED_CMAP, vmin=-lim, vmax=lim, aspect="auto")
            bar_label = f"{metric} {what}"
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.set_xlabel(col_axis)
        ax.set_ylabel(" x ".join(row_axes))
        width_chars = int(fig.get_figwidth() * ax.get_position().width * 14)
        ax.set_title(_fit(title or _title(result), max(30, width_chars)), fontsize=9)
        fig.colorbar(im, ax=ax, label=_fit(bar_label, 40))
        fig.tight_layout()
    return fig


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _fit(text: str, width: int, lines: int = 3) -> str:
    """``text`` wrapped to ``width`` characters, at most ``lines`` lines (the last cut)."""
    import textwrap

    wrapped = textwrap.wrap(text, width) or [""]
    if len(wrapped) > lines:
        wrapped = [*wrapped[: lines - 1], _short(" ".join(wrapped[lines - 1:]), width)]
    return "\n".join(wrapped)


def _title(result: Any) -> str:
    """Site and metric, then what ran and what was patched in, with the baselines."""
    def fmt(v: float | None) -> str:
        return "?" if v is None else f"{v:.3g}"

    site = _short(result.site, 48)
    clean, corr = fmt(result.clean_value), fmt(result.corrupted_value)
    if result.meta.get("ablation"):
        how = f"{result.meta['ablation']} ablation (clean {clean})"
    elif result.meta.get("direction", "denoise") == "noise":
        how = f"noise: clean run {clean}, corrupted patched in ({corr})"
    else:
        how = f"denoise: corrupted run {corr}, clean patched in ({clean})"
    return f"{site}: {_short(result.metric, 32)}; {how}"


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
