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

from mechsink.viz.style import SCORE_CMAP, save, use_style


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


@use_style
def sink_heatmaps(data: Mapping[str, Any], path: Path) -> Path:
    """Gu's sink score (key position 0), layer x head, one panel per suite x variant."""
    runs = data["runs"]
    suites, variants = _grid(runs)
    fig, axes = plt.subplots(len(suites), len(variants), squeeze=False, layout="constrained",
                             figsize=(3.2 * len(variants) + 1, 3.4 * len(suites)))
    image = None
    for ax, s, v, run in _panels(runs, axes):
        scores = np.array([_nan(row) for row in run["sink_score"]])
        image = ax.imshow(scores, aspect="auto", vmin=0, vmax=1, cmap=SCORE_CMAP,
                          origin="lower", interpolation="nearest")
        ax.set_title(f"{s}/{v}: rate {run['sink_rate']:.2f}", fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
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
                             figsize=(3.4 * len(variants), 2.8 * len(suites)))
    for ax, s, v, run in _panels(runs, axes):
        mags = run["layer_magnitudes"]
        for key in ("top1", "top2", "top3", "median"):
            if mags.get(key) is not None:
                ax.plot(_nan(mags[key]), marker=".", label=key)
        ax.set_yscale("log")
        ax.set_title(f"{s}/{v}", fontsize=9)
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("|residual| (hook_resid_post)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{data['model']}: largest and median activation magnitudes per layer")
    fig.tight_layout()
    return save(fig, path)


@use_style
def norm_ratios(data: Mapping[str, Any], path: Path) -> Path:
    """First-token norm ratio per layer, one line per suite x variant (log scale)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in data["runs"]:
        ax.plot(_nan(run["first_token_norm_ratio"]), marker=".", label=run["name"])
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("||x[l,0]|| / mean_{p>0} ||x[l,p]||")
    ax.set_title(f"{data['model']}: first-token norm ratio")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save(fig, path)


@use_style
def mlp_spikes(data: Mapping[str, Any], path: Path) -> Path:
    """Largest |down-projection input| and |MLP output| per layer (Yu et al.'s spike plot)."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for run in data["runs"]:
        axes[0].plot(_nan(run["mlp_spikes"]["max_abs_input"]), marker=".", label=run["name"])
        axes[1].plot(_nan(run["mlp_spikes"]["max_abs_output"]), marker=".", label=run["name"])
    for ax, what in zip(axes, ("down-projection input (mlp.hook_post)",
                               "MLP output (hook_mlp_out)"), strict=True):
        ax.axhline(50, color="grey", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"max |{what}|", fontsize=9)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"{data['model']}: MLP spikes (threshold 50)")
    fig.tight_layout()
    return save(fig, path)


@use_style
def sink_rates(data: Mapping[str, Any], path: Path) -> Path:
    """Sink rate (Gu's score and the i>0 version) per input suite x first-token variant."""
    runs = data["runs"]
    fig, ax = plt.subplots(figsize=(max(4.5, 0.7 * len(runs) + 1.5), 3.2))
    x = np.arange(len(runs))
    ax.bar(x - 0.2, [r["sink_rate"] for r in runs], 0.4, label="Gu (queries i >= 0)")
    ax.bar(x + 0.2, [r["sink_rate_no_self"] for r in runs], 0.4, label="queries i >= 1")
    ax.set_xticks(x, [r["name"] for r in runs], rotation=35, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"sink rate (eps = {data['settings']['eps']})")
    ax.set_title(f"{data['model']}: fraction of heads with sink score > eps")
    ax.legend()
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
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    ax = axes[0]
    ax.plot(_nan(vd["ratio"]), marker=".", label="measured Var(pos 0) / mean Var(pos > 0)")
    ax.plot(_nan(vd["predicted_ratio"]), marker=".", ls="--",
            label="uniform mixing: sum_j A[t,j]^2 ratio")
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(f"{run['name']}: variance discrepancy per layer")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = axes[1]
    variance = np.array([_nan(row) for row in vd["variance"]])
    n_layers = variance.shape[0]
    for layer in sorted({0, n_layers // 2, n_layers - 1}):
        row = variance[layer]
        ax.plot(row / np.nanmean(row[1:]), label=f"layer {layer}")
    ax.set_yscale("log")
    ax.set_xlabel("position")
    ax.set_ylabel("Var(attn output) / mean over p > 0")
    ax.set_title("variance over sequences, by position")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.suptitle(f"{data['model']}: attention-output variance (n = {run['n']} sequences)")
    fig.tight_layout()
    return save(fig, path)


FIGURES = {"sink_scores.png": sink_heatmaps, "magnitudes.png": magnitudes,
           "norm_ratio.png": norm_ratios, "mlp_spikes.png": mlp_spikes,
           "sink_rates.png": sink_rates, "variance.png": variance_profile}


def write_figures(data: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Every census figure as a PNG in ``out_dir``."""
    return [make(data, out_dir / name) for name, make in FIGURES.items()]
