"""Census figures (matplotlib, PNG): sink-score heatmaps, per-layer magnitudes, norm ratios."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _grid(runs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    suites = list(dict.fromkeys(r["suite"] for r in runs))
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    return suites, variants


def _find(runs: list[dict[str, Any]], suite: str, variant: str) -> dict[str, Any] | None:
    return next((r for r in runs if r["suite"] == suite and r["variant"] == variant), None)


def _nan(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def sink_heatmaps(data: Mapping[str, Any], path: Path) -> Path:
    """Gu's sink score (key position 0), layer x head, one panel per suite x variant."""
    runs = data["runs"]
    suites, variants = _grid(runs)
    fig, axes = plt.subplots(len(suites), len(variants), squeeze=False, layout="constrained",
                             figsize=(3.2 * len(variants) + 1, 3.4 * len(suites)))
    image = None
    for i, s in enumerate(suites):
        for j, v in enumerate(variants):
            ax = axes[i][j]
            run = _find(runs, s, v)
            if run is None:
                ax.axis("off")
                continue
            scores = np.array([_nan(row) for row in run["sink_score"]])
            image = ax.imshow(scores, aspect="auto", vmin=0, vmax=1, cmap="viridis",
                              origin="lower", interpolation="nearest")
            ax.set_title(f"{s}/{v}: rate {run['sink_rate']:.2f}", fontsize=9)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
    if image is not None:
        fig.colorbar(image, ax=axes, shrink=0.8, label="sink score (Gu, key 0)")
    fig.suptitle(f"{data['model']}: sink score per layer and head")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def magnitudes(data: Mapping[str, Any], path: Path) -> Path:
    """Top-3 and median |residual| per layer (log scale), one panel per suite x variant."""
    runs = data["runs"]
    suites, variants = _grid(runs)
    fig, axes = plt.subplots(len(suites), len(variants), squeeze=False, sharey=True,
                             figsize=(3.4 * len(variants), 2.8 * len(suites)))
    for i, s in enumerate(suites):
        for j, v in enumerate(variants):
            ax = axes[i][j]
            run = _find(runs, s, v)
            if run is None:
                ax.axis("off")
                continue
            mags = run["layer_magnitudes"]
            for key in ("top1", "top2", "top3", "median"):
                if mags.get(key) is not None:
                    ax.plot(_nan(mags[key]), marker=".", label=key)
            ax.set_yscale("log")
            ax.set_title(f"{s}/{v}", fontsize=9)
            ax.set_xlabel("layer")
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("|residual| (hook_resid_post)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{data['model']}: largest and median activation magnitudes per layer")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def norm_ratios(data: Mapping[str, Any], path: Path) -> Path:
    """First-token norm ratio per layer, one line per suite x variant (log scale)."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for run in data["runs"]:
        ax.plot(_nan(run["first_token_norm_ratio"]), marker=".", label=run["name"])
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("||x[l,0]|| / mean_{p>0} ||x[l,p]||")
    ax.set_title(f"{data['model']}: first-token norm ratio")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
        ax.set_title(f"max |{what}|", fontsize=9)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"{data['model']}: MLP spikes (threshold 50)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


FIGURES = {"sink_scores.png": sink_heatmaps, "magnitudes.png": magnitudes,
           "norm_ratio.png": norm_ratios, "mlp_spikes.png": mlp_spikes}


def write_figures(data: Mapping[str, Any], out_dir: Path) -> list[Path]:
    """Every census figure as a PNG in ``out_dir``."""
    return [make(data, out_dir / name) for name, make in FIGURES.items()]
