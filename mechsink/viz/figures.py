"""Census figures (matplotlib, PNG): sink-score heatmaps, sink rates, per-layer magnitudes, norm
ratios, MLP spikes and the attention-output variance profile.

Every function takes the census data (``census.json`` read with
:func:`mechsink.measure.census.read_census`) and a path, draws in :mod:`mechsink.viz.style` and
returns the path.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from mechsink.viz.style import MIN_FONT, PAGE_WIDTH, PALETTE, SCORE_CMAP, save, use_style

SUITE_DASHES = ("-", "--", ":", "-.")
SUITE_MARKERS = ("o", "s", "^", "D")


def _grid(runs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    suites = list(dict.fromkeys(r["suite"] for r in runs))
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    return suites, variants


def _find(runs: list[dict[str, Any]], suite: str, variant: str) -> dict[str, Any] | None:
    return next((r for r in runs if r["suite"] == suite and r["variant"] == variant), None)


def _panels(runs: list[dict[str, Any]], axes: Any) -> Iterator[tuple[Any, str, str, dict]]:
    """(axis, suite, variant, run) for each panel of a suite x variant grid; panels without a
    run are blanked."""
    suites, variants = _grid(runs)
    for i, s in enumerate(suites):
        for j, v in enumerate(variants):
            run = _find(runs, s, v)
            if run is None:
                axes[i][j].axis("off")
            else:
                yield axes[i][j], s, v, run


def _nan(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def run_style(runs: list[dict[str, Any]], run: dict[str, Any]) -> dict[str, Any]:
    """A distinct line style per census run: the colour says the first-token variant, the dash
    and marker the suite (nine runs never share a colour and a dash)."""
    suites, variants = _grid(runs)
    i, j = suites.index(run["suite"]), variants.index(run["variant"])
    return {"color": PALETTE[j % len(PALETTE)], "ls": SUITE_DASHES[i % len(SUITE_DASHES)],
            "marker": SUITE_MARKERS[i % len(SUITE_MARKERS)], "ms": 3}


def _layer_axis(ax: Any, axis: str = "x") -> None:
    """Whole-number ticks on a layer (or position) axis."""
    getattr(ax, f"{axis}axis").set_major_locator(MaxNLocator(integer=True))


@use_style
def sink_heatmaps(data: Mapping[str, Any], path: Path) -> Path:
    """Gu's sink score (key position 0), layer x head, one panel per suite x variant."""
    runs = data["runs"]
    suites, variants = _grid(runs)
    fig, axes = plt.subplots(len(suites), len(variants), squeeze=False, layout="constrained",
                             figsize=(PAGE_WIDTH, 2.3 * len(suites) + 0.5))
    image = None
    for ax, s, v, run in _panels(runs, axes):
        scores = np.array([_nan(row) for row in run["sink_score"]])
        image = ax.imshow(scores, aspect="auto", vmin=0, vmax=1, cmap=SCORE_CMAP,
                          origin="lower", interpolation="nearest")
        ax.set_title(f"{s}/{v}: rate {run['sink_rate']:.2f}", fontsize=MIN_FONT)
        _layer_axis(ax, "x")
        _layer_axis(ax, "y")
        ax.set_xlabel("head", fontsize=MIN_FONT)
        ax.set_ylabel("layer", fontsize=MIN_FONT)
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="sink score (Gu, key 0)")
    fig.suptitle(f"{data['model']}: sink score per layer and head")
    return save(fig, path)


@use_style
def magnitudes(data: Mapping[str, Any], path: Path) -> Path:
    """Top-3 and median |residual| per layer (log scale), one panel per suite x variant."""
    runs = data["runs"]
    suites, variants = _grid(runs)
    fig, axes = plt.subplots(len(suites), len(variants), squeeze=False, sharey=True,
                             layout="constrained", figsize=(PAGE_WIDTH, 2.1 * len(suites) + 0.9))
    for ax, s, v, run in _panels(runs, axes):
        mags = run["layer_magnitudes"]
        for key, color in zip(("top1", "top2", "top3", "median"), PALETTE, strict=False):
            if mags.get(key) is not None:
                ax.plot(_nan(mags[key]), marker=".", color=color, label=key)
        ax.set_yscale("log")
        ax.set_title(f"{s}/{v}", fontsize=MIN_FONT)
        ax.set_xlabel("layer", fontsize=MIN_FONT)
        _layer_axis(ax)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("|residual|", fontsize=MIN_FONT)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, frameon=False)
    fig.suptitle(f"{data['model']}: largest and median |hook_resid_post| per layer")
    return save(fig, path)


@use_style
def norm_ratios(data: Mapping[str, Any], path: Path) -> Path:
    """First-token norm ratio per layer, one line per suite x variant (log scale)."""
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 4.2), layout="constrained")
    runs = data["runs"]
    for run in runs:
        ax.plot(_nan(run["first_token_norm_ratio"]), label=run["name"], **run_style(runs, run))
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    _layer_axis(ax)
    ax.set_ylabel("||x[l,0]|| / mean_{p>0} ||x[l,p]||")
    ax.set_title(f"{data['model']}: first-token norm ratio")
    ax.legend(ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.15), frameon=False,
              title="colour: first token; dash and marker: input suite")
    ax.grid(alpha=0.3)
    return save(fig, path)


@use_style
def mlp_spikes(data: Mapping[str, Any], path: Path) -> Path:
    """Largest |down-projection input| and |MLP output| per layer (Yu et al.'s spike plot)."""
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 4.2), sharey=True, layout="constrained")
    runs = data["runs"]
    for run in runs:
        style = run_style(runs, run)
        axes[0].plot(_nan(run["mlp_spikes"]["max_abs_input"]), label=run["name"], **style)
        axes[1].plot(_nan(run["mlp_spikes"]["max_abs_output"]), label=run["name"], **style)
    for ax, what in zip(axes, ("down-projection input\n(mlp.hook_post)",
                               "MLP output\n(hook_mlp_out)"), strict=True):
        ax.axhline(50, color="grey", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        _layer_axis(ax)
        ax.set_title(f"max |{what}|", fontsize=MIN_FONT)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=3, frameon=False,
               title="colour: first token; dash and marker: input suite")
    fig.suptitle(f"{data['model']}: MLP spikes (threshold 50)")
    return save(fig, path)


@use_style
def sink_rates(data: Mapping[str, Any], path: Path) -> Path:
    """Sink rate (Gu's score and the i>0 version) per input suite x first-token variant."""
    runs = data["runs"]
    fig, ax = plt.subplots(figsize=(min(PAGE_WIDTH, max(4.5, 0.7 * len(runs) + 1.5)), 3.4))
    x = np.arange(len(runs))
    ax.bar(x - 0.2, [r["sink_rate"] for r in runs], 0.4, label="Gu (queries i >= 0)")
    ax.bar(x + 0.2, [r["sink_rate_no_self"] for r in runs], 0.4, label="queries i >= 1")
    ax.set_xticks(x, [r["name"] for r in runs], rotation=35, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"sink rate (eps = {data['settings']['eps']})")
    ax.set_title(f"{data['model']}: fraction of heads with sink score > eps")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=2, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save(fig, path)


def variance_run(data: Mapping[str, Any]) -> dict[str, Any]:
    """The run to show the variance discrepancy on: random first token if there is one (with a
    fixed first token the variance at position 0 is exactly 0), natural text preferred."""
    runs = data["runs"]
    for suite in ("natural", "random"):
        for r in runs:
            if r["suite"] == suite and r["variant"] == "randfirst":
                return r
    return runs[0]


@use_style
def variance_profile(data: Mapping[str, Any], path: Path) -> Path:
    """Variance over sequences of the attention output: position 0 over later positions per
    layer (measured vs the uniform-mixing prediction), and the profile over positions."""
    run = variance_run(data)
    vd = run["variance_discrepancy"]
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 4.0), layout="constrained")
    ax = axes[0]
    ax.plot(_nan(vd["ratio"]), marker=".", color=PALETTE[0],
            label="measured Var(pos 0) / mean Var(pos > 0)")
    ax.plot(_nan(vd["predicted_ratio"]), marker=".", ls="--", color=PALETTE[1],
            label="uniform mixing: sum_j A[t,j]^2 ratio")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    _layer_axis(ax)
    ax.set_title(f"{run['name']}:\nvariance discrepancy per layer")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    ax.grid(alpha=0.3)
    ax = axes[1]
    variance = np.array([_nan(row) for row in vd["variance"]])
    n_layers = variance.shape[0]
    for layer, color in zip(sorted({0, n_layers // 2, n_layers - 1}), PALETTE[2:], strict=False):
        row = variance[layer]
        ax.plot(row / np.nanmean(row[1:]), color=color, label=f"layer {layer}")
    ax.set_yscale("log")
    ax.set_xlabel("position")
    _layer_axis(ax)
    ax.set_ylabel("Var(attn output) / mean over p > 0")
    ax.set_title("variance over sequences,\nby position")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False, ncol=3)
    ax.grid(alpha=0.3)
    fig.suptitle(f"{data['model']}: attention-output variance (n = {run['n']} sequences)")
    return save(fig, path)


FIGURES = {"sink_scores.png": sink_heatmaps, "magnitudes.png": magnitudes,
           "norm_ratio.png": norm_ratios, "mlp_spikes.png": mlp_spikes,
           "sink_rates.png": sink_rates, "variance.png": variance_profile}

#: figure -> (the census.json field of each run it draws, the census measurement writing it)
NEEDS = {"sink_scores.png": ("sink_score", "sinks"),
         "magnitudes.png": ("layer_magnitudes", "massive"),
         "norm_ratio.png": ("first_token_norm_ratio", "norm_ratio"),
         "mlp_spikes.png": ("mlp_spikes", "mlp"),
         "sink_rates.png": ("sink_rate", "sinks"),
         "variance.png": ("variance_discrepancy", "variance")}


def not_drawn(data: Mapping[str, Any]) -> dict[str, str]:
    """The census figures that cannot be drawn from ``data``, each with why: no run holds the
    field it draws (the census marked that measurement not applicable to this model, e.g. MLP
    spikes on a mixture of experts, whose MLP has one down projection per expert)."""
    out = {}
    for name, (key, measurement) in NEEDS.items():
        runs = data["runs"]
        if runs and all(key not in r for r in runs):
            reasons = [r.get("not_applicable", {}).get(measurement) for r in runs]
            why = next((w for w in reasons if w), "the census holds no such measurement")
            out[name] = f"not applicable to this model: {why}"
    return out


def write_figures(data: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Every census figure that applies to the model (see :func:`not_drawn`) as a PNG in
    ``out_dir``; a figure some runs lack data for is drawn from the runs that have it."""
    skipped = not_drawn(data)
    paths = []
    for name, make in FIGURES.items():
        if name in skipped:
            continue
        key = NEEDS[name][0]
        runs = [r for r in data["runs"] if key in r]
        paths.append(make({**data, "runs": runs}, out_dir / name))
    return paths
