"""The heatmap of a patching result, drawn from the saved JSON (or a :class:`PatchResult`).

Rows are every axis but the position-like one (flattened), columns are positions; colours show
each patch's effect (value minus the unpatched run input's metric; normalised results as they
are) on a diverging scale centred on zero (:data:`mechsink.viz.style.SIGNED_CMAP`). Large
results are drawn for their shape: thinned labels, one panel per position, wrapped senders.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mechsink.viz.style import MIN_FONT, PAGE_WIDTH, SCORE_CMAP, SIGNED_CMAP, styled


def _as_result(result: Any) -> Any:
    from mechsink.patching.result import PatchResult

    if isinstance(result, (str, Path)):
        return PatchResult.from_json(result)
    return result


#: more rows (or columns) than this get thinned tick labels; a one-axis result longer than
#: :data:`WRAP` is wrapped into a grid; a position x layer x unit result with more rows than
#: :data:`FACET_ROWS` is drawn as one layer x unit panel per position
MAX_LABELS, WRAP, FACET_ROWS = 40, 40, 48


def heatmap(result: Any, ax: Any = None, *, raw: bool = False, title: str | None = None) -> Any:
    """A matplotlib figure of a patching result: a ``PatchResult`` or the path of its JSON
    (``PatchResult.to_json``).

    Colours show each patch's effect (value minus the run input's metric) on a scale centred
    on zero; ``raw=True`` shows the values themselves on a sequential scale. The title (or
    ``title``) names the site, the metric, the direction and the two baselines, wrapped to the
    figure's width. Drawn for the shape of the data: rows are every axis but the position one
    (flattened) and columns positions, with thinned labels when there are many; a layer x
    head (or neuron) x position result with many rows gets one layer x unit panel per position
    (without ``ax``); a one-axis result (path patching's senders) is a layer x (heads, MLP)
    grid when its senders are heads and MLPs, else wrapped into rows."""
    import matplotlib.pyplot as plt

    result = _as_result(result)
    axes = list(result.axes)
    pos_axis = next((a for a in ("pos", "dest_pos", "src_pos") if a in axes), None)
    if ax is None and pos_axis is not None and len(axes) == 3 and "layer" in axes:
        unit = next(a for a in axes if a not in (pos_axis, "layer"))
        if len(result.labels["layer"]) * len(result.labels[unit]) > FACET_ROWS:
            return _facets(result, pos_axis, unit, raw=raw, title=title)
    if len(axes) == 1:
        vals, rows, cols, xlabel, ylabel = _one_axis(result)
    else:
        vals, rows, cols, xlabel, ylabel = _rows_by_columns(result, axes, pos_axis)
    with styled():
        if ax is None:
            size = (min(PAGE_WIDTH, max(4.5, 0.3 * min(len(cols), 2 * MAX_LABELS) + 2.5)),
                    min(14, max(2.5, 0.22 * min(len(rows), 2 * MAX_LABELS) + 1.8)))
            fig, ax = plt.subplots(figsize=size)
        else:
            fig = ax.figure
        im, bar_label = _image(ax, result, vals, raw=raw)
        _ticks(ax, rows, cols)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        width_chars = int(fig.get_figwidth() * ax.get_position().width * 14)
        ax.set_title(_fit(title or _title(result), max(30, width_chars)), fontsize=MIN_FONT + 1)
        fig.colorbar(im, ax=ax, label=_fit(bar_label, 40))
        fig.tight_layout()
    return fig


def _image(ax: Any, result: Any, vals: Tensor, *, raw: bool, lim: float | None = None
           ) -> tuple[Any, str]:
    """Draw ``vals`` (effects on a centred scale, or raw values); the colour bar's label."""
    import matplotlib as mpl

    metric = _short(result.metric, 32)
    if raw:
        cmap = mpl.colormaps[SCORE_CMAP].with_extremes(bad="#dddddd")
        im = ax.imshow(vals.numpy(), cmap=cmap, aspect="auto", interpolation="nearest")
        return im, metric + (" (0 = run input, 1 = source)"
                             if result.meta.get("normalized") else "")
    base, what = _baseline(result)
    vals = vals - base
    if lim is None:
        finite = vals[torch.isfinite(vals)]
        lim = float(finite.abs().max()) if finite.numel() else 1.0
    cmap = mpl.colormaps[SIGNED_CMAP].with_extremes(bad="#dddddd")
    im = ax.imshow(vals.numpy(), cmap=cmap, vmin=-(lim or 1.0), vmax=lim or 1.0, aspect="auto",
                   interpolation="nearest")
    return im, f"{metric} {what}"


def _ticks(ax: Any, rows: list[str], cols: list[str]) -> None:
    """Tick labels, every k-th one when there are more than :data:`MAX_LABELS`."""
    for axis, labels, rot in ((ax.yaxis, rows, 0), (ax.xaxis, cols, 90)):
        step = max(1, -(-len(labels) // MAX_LABELS))
        where = list(range(0, len(labels), step))
        axis.set_ticks(where, [labels[i] for i in where], fontsize=MIN_FONT, rotation=rot)


def _rows_by_columns(result: Any, axes: list[str], pos_axis: str | None
                     ) -> tuple[Tensor, list[str], list[str], str, str]:
    col_axis = pos_axis or axes[-1]
    order = [a for a in axes if a != col_axis] + [col_axis]
    vals = result.values.permute(*[axes.index(a) for a in order]).reshape(
        -1, len(result.labels[col_axis])).to(torch.float32)
    row_axes = order[:-1]
    rows = _row_labels(result, row_axes)
    return vals, rows, _col_labels(result, col_axis), col_axis, " x ".join(row_axes)


def _col_labels(result: Any, col_axis: str) -> list[str]:
    if col_axis in ("pos", "dest_pos", "src_pos") and result.tokens:
        return [f"{p}:{_short(repr(result.tokens[p]), 12)}" for p in result.labels[col_axis]]
    return [str(v) for v in result.labels[col_axis]]


_SENDER = re.compile(r"^(?:L(\d+)H(\d+)|MLP(\d+))$")


def _one_axis(result: Any) -> tuple[Tensor, list[str], list[str], str, str]:
    """A one-axis result as one row, or (longer than :data:`WRAP`) a layer x (heads, MLP) grid
    when every label is a head or an MLP, else wrapped into rows of equal length."""
    axis = result.axes[0]
    labels = [str(v) for v in result.labels[axis]]
    vals = result.values.to(torch.float32)
    n = len(labels)
    if n <= WRAP:
        return vals.reshape(1, -1), [""], labels, axis, ""
    parsed = [_SENDER.match(x) for x in labels]
    if all(parsed):
        layers = sorted({int(m.group(1) or m.group(3)) for m in parsed if m})
        heads = sorted({int(m.group(2)) for m in parsed if m and m.group(2) is not None})
        mlp = any(m.group(3) is not None for m in parsed if m)
        cols = [f"H{h}" for h in heads] + (["MLP"] if mlp else [])
        grid = torch.full((len(layers), len(cols)), float("nan"))
        for m, v in zip(parsed, vals.tolist(), strict=True):
            assert m is not None
            row = layers.index(int(m.group(1) or m.group(3)))
            col = cols.index("MLP") if m.group(3) is not None else heads.index(int(m.group(2)))
            grid[row, col] = v
        return grid, [f"L{x}" for x in layers], cols, f"{axis}: head / MLP", "layer"
    width = max(8, math.ceil(math.sqrt(2.5 * n)))
    n_rows = -(-n // width)
    grid = torch.full((n_rows * width,), float("nan"))
    grid[:n] = vals
    rows = [f"{labels[i * width]}.." for i in range(n_rows)]
    return (grid.reshape(n_rows, width), rows, [f"+{j}" for j in range(width)],
            f"{axis} (row start + offset)", axis)


def _facets(result: Any, pos_axis: str, unit: str, *, raw: bool, title: str | None) -> Any:
    """One layer x ``unit`` panel per position, on one colour scale (a z-by-position result of
    a model with many layers and heads)."""
    import matplotlib.pyplot as plt

    axes = list(result.axes)
    vals = result.values.permute(axes.index(pos_axis), axes.index("layer"),
                                 axes.index(unit)).to(torch.float32)
    n_pos = vals.shape[0]
    ncols = min(n_pos, 3)
    nrows = -(-n_pos // ncols)
    layers, units = result.labels["layer"], result.labels[unit]
    base = 0.0 if raw else _baseline(result)[0]
    finite = vals[torch.isfinite(vals)] - base
    lim = float(finite.abs().max()) if finite.numel() else 1.0
    cols = _col_labels(result, pos_axis)
    with styled():
        panel_w = (PAGE_WIDTH - 1.4) / ncols
        panel_h = min(3.6, max(1.8, 0.09 * len(layers) + 0.9))
        fig, grid = plt.subplots(nrows, ncols, squeeze=False, sharex=True, sharey=True,
                                 figsize=(panel_w * ncols + 1.4, panel_h * nrows + 0.9),
                                 layout="constrained")
        im = None
        for i, ax in enumerate(grid.flat):
            if i >= n_pos:
                ax.axis("off")
                continue
            im, bar_label = _image(ax, result, vals[i], raw=raw, lim=None if raw else lim)
            if raw:
                im.set_clim(float(vals.nan_to_num().min()), float(vals.nan_to_num().max()))
            ax.set_title(_short(cols[i], 18), fontsize=MIN_FONT)
            for axis, labels, most in ((ax.yaxis, layers, 8), (ax.xaxis, units, 6)):
                where = list(range(0, len(labels), max(1, -(-len(labels) // most))))
                axis.set_ticks(where, [str(labels[j]) for j in where], fontsize=MIN_FONT)
            if i % ncols == 0:
                ax.set_ylabel("layer", fontsize=MIN_FONT)
            if i // ncols == nrows - 1 or i + ncols >= n_pos:
                ax.set_xlabel(unit, fontsize=MIN_FONT)
        assert im is not None
        fig.colorbar(im, ax=grid, shrink=0.8, label=_fit(bar_label, 40))
        fig.suptitle(_fit(title or _title(result), int(fig.get_figwidth() * 12)),
                     fontsize=MIN_FONT + 1)
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
