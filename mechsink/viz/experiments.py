"""Figures of the circuits experiments, drawn from their saved JSON (never from a model)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from mechsink.viz.style import PALETTE, save, use_style

BLUE, ORANGE, GREEN, RED = PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[3]
GRAY = "#999999"


def _save(fig: plt.Figure, path: str | Path) -> Path:
    """Lay out, write as PNG at the house resolution and close (never left open)."""
    fig.tight_layout()
    return Path(save(fig, Path(path)))


def _smooth(values: list[float], width: int) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if width <= 1 or len(v) < width:
        return v
    return np.convolve(v, np.ones(width) / width, mode="valid")


@use_style
def plot_twins(result: dict[str, Any], path: str | Path) -> Path:
    """Loss curves (mean and min-max band over seeds) and sink rate per checkpoint, per arm."""
    fig, (ax_loss, ax_sink) = plt.subplots(1, 2, figsize=(11, 4))
    for color, (arm, runs) in zip((BLUE, ORANGE), result["arms"].items(),
                                  strict=False):
        width = max(1, len(runs[0]["losses"]) // 50)
        curves = np.stack([_smooth(r["losses"], width) for r in runs])
        steps = np.arange(curves.shape[1]) + width
        ax_loss.plot(steps, curves.mean(0), color=color, label=arm)
        ax_loss.fill_between(steps, curves.min(0), curves.max(0), color=color, alpha=0.2)
        for i, run in enumerate(runs):
            pts = [p for p in run["timeline"] if p["step"] > 0]
            ax_sink.plot([p["step"] for p in pts], [p["sink_rate_no_self"] for p in pts],
                         marker="o", color=color, alpha=0.8, label=arm if i == 0 else None)
    ax_loss.set(xlabel="step", ylabel="training loss (smoothed)", title="loss, mean and range")
    ax_sink.set(xscale="log", xlabel="step", ylabel="sink rate (key 0, queries i > 0)",
                title=f"sink rate, eps = {result['eps']}")
    for ax in (ax_loss, ax_sink):
        ax.legend()
        ax.grid(alpha=0.3)
    return _save(fig, path)


@use_style
def plot_sink_free(result: dict[str, Any], path: str | Path, metrics: dict[str, str]) -> Path:
    """One row per task, one panel per measurement (``metrics``: key in an arm's ``final`` ->
    title): each seed a dot, the mean a bar; and the sink timeline (largest sink score over
    checkpoints) of every arm, seed-averaged."""
    tasks = result["tasks"]
    cols = len(metrics) + 1
    fig, axes = plt.subplots(len(tasks), cols, figsize=(3.2 * cols, 3.0 * len(tasks)),
                             squeeze=False)
    for row, (recipe, task) in enumerate(tasks.items()):
        names = list(task["arms"])
        for col, (metric, title) in enumerate(metrics.items()):
            ax = axes[row][col]
            for x, v in enumerate(names):
                vals = [a["final"][metric] for a in task["arms"][v]]
                ax.bar(x, statistics.fmean(vals), color="0.8")
                ax.scatter([x] * len(vals), vals, s=10, color="k", zorder=3)
            ax.set_xticks(range(len(names)), names, rotation=60, fontsize=7)
            ax.set_title(f"{title}\n{recipe}", fontsize=8)
            if metric in ("max_abs_resid", "first_token_norm_ratio"):
                ax.set_yscale("log")
        ax = axes[row][-1]
        for v in names:
            runs = task["arms"][v]
            steps = [p["step"] for p in runs[0]["timeline"]]
            mean = [statistics.fmean(r["timeline"][i]["max_sink_score"] for r in runs)
                    for i in range(len(steps))]
            ax.plot([max(s, 1) for s in steps], mean, label=v, marker=".")
        ax.set_xscale("log")
        ax.set_title(f"largest sink score over training\n{recipe}", fontsize=8)
        ax.legend(fontsize=6)
    return _save(fig, path)


@use_style
def plot_ablations(result: dict[str, Any], path: str | Path) -> Path:
    """Sink score of each sink head: baseline and after each ablation (grouped bars)."""
    heads = result["sink_heads"]
    arms = ["baseline", *result["ablations"]]
    fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(heads), 3.8))
    width = 0.8 / len(arms)
    for k, arm in enumerate(arms):
        values = [h["sink_score"] if arm == "baseline" else result["ablations"][arm]["per_head"][i]
                  for i, h in enumerate(heads)]
        ax.bar(np.arange(len(heads)) + k * width, values, width, label=arm)
    ax.set_xticks(np.arange(len(heads)) + 0.4 - width / 2,
                  [f"L{h['layer']}H{h['head']}" for h in heads])
    ax.set(ylabel="sink score (key 0, queries i > 0)", title=result["model"], ylim=(0, 1))
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


@use_style
def plot_timeline(timeline: dict[str, Any], path: str | Path) -> Path:
    """Sink rate, first-token norm ratio, largest residual value and loss against step."""
    pts = [p for p in timeline["points"] if p["step"] > 0]
    steps = [p["step"] for p in pts]
    panels = [("sink_rate_no_self", "sink rate (key 0, i > 0)"),
              ("first_token_norm_ratio", "first-token norm ratio (max over layers)"),
              ("max_abs_resid", "largest |residual| value"),
              ("loss", "training loss")]
    fig, axes = plt.subplots(1, 4, figsize=(15, 3.4))
    for ax, (key, label) in zip(axes, panels, strict=True):
        ax.plot(steps, [p[key] for p in pts], marker="o")
        ax.set(xscale="log", xlabel="step", title=label)
        ax.grid(alpha=0.3)
    fig.suptitle(timeline.get("run", ""))
    return _save(fig, path)


def _band(ax: Any, x: list[float], rows: list[dict | None], color: str, label: str,
          marker: str = "o") -> None:
    """A mean line with its interval as a band (rows: {mean, low, high} or None)."""
    pts = [(xi, r) for xi, r in zip(x, rows, strict=True) if r is not None]
    if not pts:
        return
    xs = [p[0] for p in pts]
    ax.plot(xs, [p[1]["mean"] for p in pts], marker=marker, color=color, label=label)
    ax.fill_between(xs, [p[1]["low"] for p in pts], [p[1]["high"] for p in pts], color=color,
                    alpha=0.25)


def draw_dose_response(ax: Any, curve: dict[str, Any], title: str = "") -> Any:
    """One dose-response (``mechsink.interventions.chain.DoseResponse.to_dict()``) on ``ax``:
    |channel| at position 0 (log scale, left) and, on a twin axis, the late-layer sink score and
    the sink rate with their 95% intervals; the half-effect dose as a dashed line. Returns the
    twin."""
    rows = curve["rows"]
    x = [r["dose"] for r in rows]
    chans = [abs(r["channel"]["mean"]) if r["channel"] else np.nan for r in rows]
    ax.plot(x, chans, marker="o", color=RED, label="|channel| at position 0")
    ax.set_xscale("symlog", linthresh=0.02)
    ax.set_yscale("log")
    ax.set(xlabel="dose (factor on the set at position 0; 0 = removed)",
           ylabel="|channel| at position 0", title=title or curve["target"][:60])
    twin = ax.twinx()
    _band(twin, x, [r["late_sink_score"] for r in rows], BLUE, "late-layer sink score", "s")
    _band(twin, x, [r["sink_rate"] for r in rows], GREEN, "sink rate", "^")
    twin.set_ylim(0, 1)
    twin.set_ylabel("sink score / rate at key 0")
    half = curve["half_effect"]
    if half.get("dose") is not None:
        twin.axvline(half["dose"], color=GRAY, ls="--",
                     label=f"half effect: dose {half['dose']:.3g}")
    lines = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    twin.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="lower right")
    ax.grid(alpha=0.3)
    return twin


@use_style
def plot_dose_response(curve: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """The dose-response figure of one target, alone."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    draw_dose_response(ax, curve, title)
    return _save(fig, path)


@use_style
def plot_structural_origin(result: dict[str, Any], path: str | Path) -> Path:
    """Left: the complete set's dose-response (channel, late-layer sink score, sink rate, with
    intervals). Middle: channel surgery. Right: the sink at position k before and after each
    intervention."""
    fig, (ax_dose, ax_surg, ax_move) = plt.subplots(1, 3, figsize=(17, 4.6))
    sets = result["super_neuron_sets"]
    curve = result["dose_response"]["creating_set"]
    draw_dose_response(ax_dose, curve, f"{result['model']}: complete set of MLP "
                       f"{sets['creating_layer']} -> ch {sets['channel']}")
    rows = result["surgery"]["rows"]
    x = np.arange(len(rows))
    for off, key, color, label in ((-0.2, "late_sink_score", BLUE, "late-layer sink score"),
                                   (0.2, "sink_rate", GREEN, "sink rate")):
        vals = [r[key] for r in rows]
        means = [v["mean"] if v else np.nan for v in vals]
        err = [[(v["mean"] - v["low"]) if v else 0 for v in vals],
               [(v["high"] - v["mean"]) if v else 0 for v in vals]]
        ax_surg.bar(x + off, means, 0.4, yerr=err, color=color, label=label, capsize=3)
    ax_surg.set_xticks(x, [r["condition"] for r in rows], fontsize=6, rotation=25, ha="right")
    ax_surg.set(ylim=(0, 1), ylabel="at key 0 (95% interval)",
                title=f"channel surgery, input of block {result['surgery']['layer']}")
    ax_surg.legend(fontsize=7)
    moves = result["move"]
    labels = [f"k={m['k']}: {m['intervention']}" for m in moves]
    xm = np.arange(len(moves))
    ax_move.bar(xm - 0.2, [m["sink_at_k_before"] for m in moves], 0.4, label="sink at k, before")
    ax_move.bar(xm + 0.2, [m["sink_at_k_after"] for m in moves], 0.4, label="sink at k, after")
    ax_move.set_xticks(xm, labels, fontsize=7, rotation=30, ha="right")
    ax_move.set(ylabel="mean sink score at key k", title="moving the sink to position k")
    ax_move.legend(fontsize=8)
    for ax in (ax_surg, ax_move):
        ax.grid(alpha=0.3)
    return _save(fig, path)


@use_style
def plot_p0_circuit(result: dict[str, Any], path: str | Path, top: int = 8) -> Path:
    """The P0-sink circuit graph (the ``top`` components by path effect -> the super neuron's
    MLP -> massive channel, and -> the sink; line width ~ effect) above every candidate's path
    effect into the channel; minimal-circuit members in red."""
    nodes, edges = result["nodes"], result["edges"]
    members = set(result["circuit"]["members"])
    fig, (ax_g, ax_b) = plt.subplots(2, 1, figsize=(min(16, max(9, 0.13 * len(nodes))), 8.5),
                                     gridspec_kw={"height_ratios": [3, 2]})
    keys = ("via_mlp_to_channel", "direct_to_sink")
    peaks = {k: _peak(nodes, k) for k in keys}
    ranked = sorted(nodes, key=lambda n: -sum(abs(n[k] or 0.0) / peaks[k] for k in keys))
    shown = [n["name"] for n in ranked[:top]]
    mlp = next(e["via"] for e in edges if e["via"])
    channel = next(e["to"] for e in edges if e["metric"] == "massive_value")
    sink = next(e["to"] for e in edges if e["metric"] == "sink_score")
    pos = {name: (0.0, 1 - i / max(1, len(shown) - 1)) for i, name in enumerate(shown)}
    pos.update({mlp: (0.45, 0.5), channel: (0.75, 0.75), sink: (1.0, 0.35)})
    for key, to, color in (("via_mlp_to_channel", mlp, RED),
                           ("direct_to_sink", sink, BLUE)):
        peak = _peak(nodes, key)
        for n in nodes:
            if n["name"] in pos and n[key]:
                (x0, y0), (x1, y1) = pos[n["name"]], pos[to]
                ax_g.plot([x0, x1], [y0, y1], color=color, alpha=0.7,
                          lw=0.3 + 6 * abs(n[key]) / peak, ls="-" if n[key] > 0 else "--")
    via_sink = max((abs(n["via_mlp_to_sink"] or 0.0) for n in nodes), default=0.0)
    arrows = ((mlp, channel, f"clean {result['clean']['via_mlp_to_channel']:.6g}"),
              (channel, sink, f"largest effect via {mlp}: {via_sink:.3g}"))
    for a, b, label in arrows:
        ax_g.annotate("", pos[b], pos[a], arrowprops={"arrowstyle": "->", "lw": 2})
        (xa, ya), (xb, yb) = pos[a], pos[b]
        ax_g.text((xa + xb) / 2, (ya + yb) / 2 + 0.04, label, ha="center", fontsize=7)
    for name, (x, y) in pos.items():
        ax_g.text(x, y, name, ha="center", va="center", fontsize=8,
                  bbox={"boxstyle": "round", "fc": "mistyrose" if name in members else "white"})
    ax_g.set(xlim=(-0.12, 1.15), ylim=(-0.1, 1.1),
             title=f"{result['model']}: position-0 outputs path-patched to their position mean "
                   "(red: via the super neuron's MLP into the channel; blue: direct to the sink; "
                   "dashed: negative)")
    ax_g.title.set_fontsize(9)
    ax_g.axis("off")
    x = np.arange(len(nodes))
    ax_b.bar(x, [n["via_mlp_to_channel"] or 0.0 for n in nodes],
             color=[RED if n["name"] in members else GRAY for n in nodes])
    ax_b.set(ylabel=f"{channel}: clean - patched\n(via {mlp}; 0 where not upstream)")
    ax_b.set_xticks(x, [n["name"] for n in nodes], rotation=90, fontsize=5)
    ax_b.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _peak(nodes: list[dict[str, Any]], key: str) -> float:
    return max((abs(n[key] or 0.0) for n in nodes), default=0.0) or 1.0
