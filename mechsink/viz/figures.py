"""Census figures (matplotlib, PNG): sink-score heatmaps, sink rates, per-layer magnitudes, norm
ratios, MLP spikes, the attention-output variance profile, value-weighted sink shares,
secondary sinks and simulated activation quantization.

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


def natural_run(data: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """The run to show ``key`` on: natural text first (BOS, then no BOS, then a random first
    token), else the first run holding it; None when no run has it (an older census)."""
    runs = [r for r in data["runs"] if key in r]
    order = {"bos": 0, "nobos": 1, "randfirst": 2}
    runs.sort(key=lambda r: (r["suite"] != "natural", order.get(r["variant"], 3)))
    return runs[0] if runs else None


def _not_measured(ax: Any, what: str) -> None:
    ax.axis("off")
    ax.text(0.5, 0.5, f"no {what} in this census (written by an older mechsink)",
            ha="center", va="center", transform=ax.transAxes)


@use_style
def value_share(data: Mapping[str, Any], path: Path) -> Path:
    """Per head, Gu's weight sink score against the value-weighted share of key 0 (one run),
    and the share of sink heads that are dormant in every run (Guo et al. 2024)."""
    eps = data["settings"].get("eps", 0.3)
    run = natural_run(data, "value_share")
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.6), layout="constrained")
    if run is None:
        _not_measured(axes[0], "value-weighted sink share")
        axes[1].axis("off")
        return save(fig, path)
    ax = axes[0]
    weight = np.array([_nan(row) for row in run["sink_score"]])
    share = np.array([_nan(row) for row in run["value_share"]])
    layers = np.repeat(np.arange(weight.shape[0])[:, None], weight.shape[1], 1)
    points = ax.scatter(weight.ravel(), share.ravel(), c=layers.ravel(), s=10, cmap=SCORE_CMAP)
    ax.axvline(eps, color="grey", lw=0.8, ls=":")
    ax.axhline(eps, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("sink score (Gu, attention weight on key 0)")
    ax.set_ylabel("value-weighted share of key 0")
    ax.set_title(f"{run['name']}: per head\n(dormant: right of and below the lines)")
    ax.grid(alpha=0.3)
    bar = fig.colorbar(points, ax=ax, label="layer")
    bar.locator = MaxNLocator(integer=True)
    bar.update_ticks()
    ax = axes[1]
    runs = [r for r in data["runs"] if "value_share" in r]
    x = np.arange(len(runs))
    ax.bar(x, [np.nan if r.get("sink_heads_dormant_share") is None
               else r["sink_heads_dormant_share"] for r in runs], color=PALETTE[0])
    ax.set_xticks(x, [r["name"] for r in runs], rotation=35, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("dormant share of sink heads")
    ax.set_title("sink heads (score > eps) whose\nvalue share is < eps")
    ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{data['model']}: which sink heads write from the sink")
    return save(fig, path)


@use_style
def secondary_sinks(data: Mapping[str, Any], path: Path) -> Path:
    """Secondary sinks on one run: the largest head sink score of every key position per layer,
    and the tokens that most often become secondary sinks (Wong et al. 2026)."""
    run = natural_run(data, "secondary_sinks")
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.8), layout="constrained",
                             width_ratios=(3, 2))
    if run is None:
        _not_measured(axes[0], "secondary sinks")
        axes[1].axis("off")
        return save(fig, path)
    sec = run["secondary_sinks"]
    ax = axes[0]
    top = np.array([_nan(row) for row in sec["top_score"]])
    peak = float(np.nanmax(top)) if np.isfinite(top).any() else 1.0
    image = ax.imshow(top, aspect="auto", vmin=0, vmax=max(peak, 1e-6), cmap=SCORE_CMAP,
                      origin="lower", interpolation="nearest")
    ax.set_xlabel("position")
    ax.set_ylabel("layer")
    _layer_axis(ax, "x")
    _layer_axis(ax, "y")
    rate = sec.get("rate")
    ax.set_title(f"{run['name']}: largest head score of key k, mean over sequences"
                 f"\n(a sink in some layer: {0 if rate is None else rate:.1%} of keys)")
    fig.colorbar(image, ax=ax, shrink=0.8, label="max_h mean_(i>k) A[h,i,k]")
    ax = axes[1]
    tokens = (sec.get("tokens") or [])[:10]
    if tokens:
        y = np.arange(len(tokens))[::-1]
        ax.barh(y, [t["sinks"] for t in tokens], color=PALETTE[1])
        ax.set_yticks(y, [repr(t["token"]) for t in tokens])
        ax.set_xlabel(f"times a secondary sink (n = {run['n']})")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title("tokens that become\nsecondary sinks")
    else:
        ax.axis("off")
        ax.text(0.5, 0.5, "no secondary sink", ha="center", va="center",
                transform=ax.transAxes)
    fig.suptitle(f"{data['model']}: secondary sinks")
    return save(fig, path)


@use_style
def quantization(data: Mapping[str, Any], path: Path) -> Path:
    """Simulated round-to-nearest error per layer of the residual stream and the down-projection
    input (one run): int8 and int4, per tensor and per channel, with the outlier channels
    quantized (solid) or kept in full precision (dashed)."""
    run = natural_run(data, "quantization")
    fig, axes = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 4.0), layout="constrained",
                             squeeze=False)
    if run is None:
        _not_measured(axes[0][0], "quantization errors")
        axes[0][1].axis("off")
        return save(fig, path)
    q = run["quantization"]
    for ax, site in zip(axes[0], ("residual", "down_proj_input"), strict=True):
        if site not in q:
            ax.axis("off")
            continue
        i = 0
        for bits in ("int8", "int4"):
            for gran in ("per_tensor", "per_channel"):
                color = PALETTE[i % len(PALETTE)]
                i += 1
                for kept, ls in (("all", "-"), ("outliers_kept", "--")):
                    label = f"{bits} {gran.replace('_', ' ')}" + (", kept" if ls == "--" else "")
                    ax.plot(_nan(q[site][bits][gran][kept]), color=color, ls=ls, label=label)
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        _layer_axis(ax)
        ax.set_ylabel("relative error, ordinary channels")
        ax.set_title(f"{site.replace('_', ' ')} ({q[site]['hook']})")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, frameon=False,
               title="dashed: outlier channels kept in full precision")
    fig.suptitle(f"{data['model']}: simulated activation quantization ({run['name']})")
    return save(fig, path)


FIGURES = {"sink_scores.png": sink_heatmaps, "magnitudes.png": magnitudes,
           "norm_ratio.png": norm_ratios, "mlp_spikes.png": mlp_spikes,
           "sink_rates.png": sink_rates, "variance.png": variance_profile,
           "value_share.png": value_share, "secondary_sinks.png": secondary_sinks,
           "quantization.png": quantization}

#: figure -> (the census.json field of each run it draws, the census measurement writing it)
NEEDS = {"sink_scores.png": ("sink_score", "sinks"),
         "magnitudes.png": ("layer_magnitudes", "massive"),
         "norm_ratio.png": ("first_token_norm_ratio", "norm_ratio"),
         "mlp_spikes.png": ("mlp_spikes", "mlp"),
         "sink_rates.png": ("sink_rate", "sinks"),
         "variance.png": ("variance_discrepancy", "variance"),
         "value_share.png": ("value_share", "value_share"),
         "secondary_sinks.png": ("secondary_sinks", "secondary"),
         "quantization.png": ("quantization", "quantization")}


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
