"""Figures of the circuits experiments, drawn from their saved JSON (never from a model)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from mechsink.viz.style import MIN_FONT, PAGE_WIDTH, PALETTE, save, use_style

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
    fig, (ax_loss, ax_sink) = plt.subplots(1, 2, figsize=(PAGE_WIDTH, 3.6), layout="constrained")
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
    return Path(save(fig, Path(path)))


@use_style
def plot_sink_free(result: dict[str, Any], path: str | Path, metrics: dict[str, str]) -> Path:
    """Per task, one panel per measurement (``metrics``: key in an arm's ``final`` -> title):
    each seed a dot, the mean a bar (n/a where a seed's measurement did not apply); and the
    sink timeline (largest sink score over
    checkpoints) of every arm, seed-averaged. Three panels a row, at page width."""
    tasks = result["tasks"]
    per_task = len(metrics) + 1
    cols = min(3, per_task)
    rows_per_task = -(-per_task // cols)
    fig, axes = plt.subplots(rows_per_task * len(tasks), cols, squeeze=False,
                             figsize=(PAGE_WIDTH, 2.6 * rows_per_task * len(tasks)),
                             layout="constrained")
    for t, (recipe, task) in enumerate(tasks.items()):
        names = list(task["arms"])
        panels = [axes[t * rows_per_task + k // cols][k % cols] for k in range(per_task)]
        for ax in [a for row in axes[t * rows_per_task:(t + 1) * rows_per_task] for a in row][
                per_task:]:
            ax.axis("off")
        for ax, (metric, title) in zip(panels, metrics.items(), strict=False):
            for x, v in enumerate(names):
                vals = [a["final"][metric] for a in task["arms"][v]]
                if any(isinstance(val, dict) for val in vals):  # {"not_applicable": why}
                    ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=MIN_FONT,
                            transform=ax.get_xaxis_transform())
                    continue
                ax.bar(x, statistics.fmean(vals), color="0.8")
                ax.scatter([x] * len(vals), vals, s=10, color="k", zorder=3)
            ax.set_xticks(range(len(names)), names, rotation=60, fontsize=MIN_FONT)
            ax.set_title(f"{title}\n{recipe}", fontsize=MIN_FONT)
            if metric in ("max_abs_resid", "first_token_norm_ratio"):
                ax.set_yscale("log")
        ax = panels[-1]
        for v, style in zip(names, _styles(len(names)), strict=True):
            runs = task["arms"][v]
            steps = [p["step"] for p in runs[0]["timeline"]]
            mean = [statistics.fmean(r["timeline"][i]["max_sink_score"] for r in runs)
                    for i in range(len(steps))]
            ax.plot([max(s, 1) for s in steps], mean, label=v, **style)
        ax.set_xscale("log")
        ax.set_title(f"largest sink score over training\n{recipe}", fontsize=MIN_FONT)
        ax.legend(fontsize=MIN_FONT)
    return Path(save(fig, Path(path)))


def _styles(n: int) -> list[dict[str, Any]]:
    from mechsink.viz.style import line_styles

    return [{**s, "ms": 3} for s in line_styles(n)]


@use_style
def plot_ablations(result: dict[str, Any], path: str | Path) -> Path:
    """Sink score of each sink head: baseline and after each ablation (grouped bars)."""
    heads = result["sink_heads"]
    arms = ["baseline", *result["ablations"]]
    fig, ax = plt.subplots(figsize=(min(PAGE_WIDTH, 2.6 + 1.4 * len(heads)), 3.8))
    width = 0.8 / len(arms)
    colors = [PALETTE[k % len(PALETTE)] for k in range(len(arms))]
    hatches = ["" if k < len(PALETTE) else "//" for k in range(len(arms))]
    for k, arm in enumerate(arms):
        values = [h["sink_score"] if arm == "baseline" else result["ablations"][arm]["per_head"][i]
                  for i, h in enumerate(heads)]
        ax.bar(np.arange(len(heads)) + k * width, values, width, label=arm, color=colors[k],
               hatch=hatches[k])
    ax.set_xticks(np.arange(len(heads)) + 0.4 - width / 2,
                  [f"L{h['layer']}H{h['head']}" for h in heads])
    ax.set(ylabel="sink score (key 0, queries i > 0)", title=result["model"], ylim=(0, 1))
    ax.legend(fontsize=MIN_FONT, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
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
    fig, axes = plt.subplots(2, 2, figsize=(PAGE_WIDTH, 5.6), layout="constrained")
    for ax, (key, label) in zip(axes.flat, panels, strict=True):
        ax.plot(steps, [p[key] for p in pts], marker="o")
        ax.set(xscale="log", xlabel="step", title=label)
        ax.grid(alpha=0.3)
    fig.suptitle(timeline.get("run", ""))
    return Path(save(fig, Path(path)))



def _values(rows: list[dict[str, Any]], key: str) -> list[dict | None]:
    return [r.get(key) for r in rows]


def _channel_scale(ax: Any, values: list[float]) -> None:
    """A linear axis from 0 unless the values span more than a factor of 10 (then log): on a
    log axis a 12% change fills the panel and looks like a collapse."""
    finite = [v for v in values if v is not None and np.isfinite(v) and v > 0]
    if finite and max(finite) / min(finite) > 10:
        ax.set_yscale("log")
    else:
        ax.set_ylim(0, 1.1 * max(finite, default=1.0))


def draw_dose_responses(ax: Any, curves: dict[str, dict[str, Any]], title: str = "") -> Any:
    """Several dose-responses (``DoseResponse.to_dict()``, by label) on ``ax``: |channel| at
    position 0 (left axis: linear from 0, log only past a factor of 10) and, on a twin axis,
    the late-layer sink score and the sink rate with their 95% intervals; the half-effect doses
    as dashed lines; the legend under the panel, off the data. Returns the twin."""
    twin = ax.twinx()
    styles = ("-", "--", ":")
    every: list[float] = []
    notes = []
    for i, (label, curve) in enumerate(curves.items()):
        rows, ls = curve["rows"], styles[i % len(styles)]
        x = [r["dose"] for r in rows]
        chans = [abs(r["channel"]["mean"]) if r["channel"] else np.nan for r in rows]
        every += chans
        ax.plot(x, chans, marker="o", ms=3, color=RED, ls=ls, label=f"|channel|, {label}")
        for key, color, name in (("late_sink_score", BLUE, "late-layer sink score"),
                                 ("sink_rate", GREEN, "sink rate")):
            vals = _values(rows, key)
            if all(v is None for v in vals):
                notes.append(f"{name} ({label}): not measured")
                continue
            pts = [(xi, v) for xi, v in zip(x, vals, strict=True) if v is not None]
            twin.plot([p[0] for p in pts], [p[1]["mean"] for p in pts], color=color, ls=ls,
                      marker="s" if key == "late_sink_score" else "^", ms=3,
                      label=f"{name}, {label}")
            twin.fill_between([p[0] for p in pts], [p[1]["low"] for p in pts],
                              [p[1]["high"] for p in pts], color=color, alpha=0.15, lw=0)
        half = curve.get("half_effect", {})
        if half.get("dose") is not None:
            twin.axvline(half["dose"], color=GRAY, ls=ls, lw=1,
                         label=f"half effect ({label}): dose {half['dose']:.3g}")
    ax.set_xscale("symlog", linthresh=0.02)
    _channel_scale(ax, every)
    ax.set_xlabel("dose (factor on the set at position 0; 0 = removed)", fontsize=MIN_FONT)
    ax.set_ylabel("|channel| at position 0", fontsize=MIN_FONT)
    ax.set_title(title, fontsize=MIN_FONT + 1)
    twin.set_ylim(0, 1)
    twin.set_ylabel("sink score / rate at key 0", fontsize=MIN_FONT)
    for a in (ax, twin):
        a.tick_params(labelsize=MIN_FONT)
    handles, labels = ax.get_legend_handles_labels()
    more = twin.get_legend_handles_labels()
    legend = ax.legend(handles + more[0], labels + more[1], fontsize=MIN_FONT, ncol=2,
                       loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False,
                       title="; ".join(notes) or None, title_fontsize=MIN_FONT)
    legend.set_in_layout(True)
    ax.grid(alpha=0.3)
    return twin


def draw_dose_response(ax: Any, curve: dict[str, Any], title: str = "") -> Any:
    """One dose-response on ``ax`` (see :func:`draw_dose_responses`). Returns the twin."""
    return draw_dose_responses(ax, {"set": curve}, title or curve["target"][:60])


@use_style
def plot_dose_response(curve: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """The dose-response figure of one target, alone."""
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH, 4.2), layout="constrained")
    draw_dose_response(ax, curve, title)
    return Path(save(fig, Path(path)))


def _hbars(ax: Any, labels: list[str], series: list[tuple[str, str, list[Any]]],
           xlabel: str) -> None:
    """Horizontal bars (one group per label, one bar per series, intervals where given):
    long condition names stay readable at page width."""
    y = np.arange(len(labels))
    h = 0.8 / max(1, len(series))
    for i, (name, color, vals) in enumerate(series):
        means = [v["mean"] if isinstance(v, dict) else (np.nan if v is None else v)
                 for v in vals]
        err = None
        if any(isinstance(v, dict) for v in vals):
            err = [[(v["mean"] - v["low"]) if isinstance(v, dict) else 0 for v in vals],
                   [(v["high"] - v["mean"]) if isinstance(v, dict) else 0 for v in vals]]
        missing = all(not np.isfinite(m) for m in means)
        ax.barh(y + (i - (len(series) - 1) / 2) * h, np.nan_to_num(means), h, xerr=err,
                color=color, capsize=2, label=name + (" (not measured)" if missing else ""))
    ax.set_yticks(y, labels, fontsize=MIN_FONT)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel, fontsize=MIN_FONT)
    ax.tick_params(labelsize=MIN_FONT)
    ax.legend(fontsize=MIN_FONT, loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(
        labels) < 6 else -0.12), ncol=len(series), frameon=False)
    ax.grid(axis="x", alpha=0.3)


@use_style
def plot_structural_origin(result: dict[str, Any], path: str | Path) -> Path:
    """Top: the dose-responses of the complete set and of its top neuron alone (channel,
    late-layer sink score, sink rate, with intervals). Middle: channel surgery. Bottom: the
    sink at position k along each intervention's doses (one panel per intervention, one line
    per k, against the original sink at 0); results written before the doses: before and
    after bars. Drawn at page width."""
    rows = result["surgery"]["rows"]
    moves = result["move"]
    dosed = bool(moves) and "intervals" in moves[0]
    heights = [4.6, 1.3 + 0.28 * len(rows), 2.6 if dosed else 1.3 + 0.28 * len(moves)]
    fig = plt.figure(figsize=(PAGE_WIDTH, sum(heights)), layout="constrained")
    # one sub-figure per panel: the bar charts' long labels do not squeeze the curve panel
    ax_dose, ax_surg, ax_move = (sub.subplots() for sub in fig.subfigures(
        3, 1, height_ratios=heights))
    sets = result["super_neuron_sets"]
    labels = {"creating_set": "complete set", "top_neuron_only": "top neuron only"}
    curves = {labels.get(k, k): v for k, v in result["dose_response"].items()}
    draw_dose_responses(ax_dose, curves, f"{result['model']}: MLP {sets['creating_layer']} "
                        f"-> channel {sets['channel']} at position 0")
    _hbars(ax_surg, [r["condition"] for r in rows],
           [("late-layer sink score", BLUE, _values(rows, "late_sink_score")),
            ("sink rate", GREEN, _values(rows, "sink_rate"))],
           "at key 0 (95% interval)")
    ax_surg.set_xlim(0, 1)
    ax_surg.set_title(f"channel surgery, input of block {result['surgery']['layer']}",
                      fontsize=MIN_FONT + 1)
    if dosed:
        _move_curves(ax_move, moves)
    else:
        _hbars(ax_move, [f"k={m['k']}: {m['intervention']}" for m in moves],
               [("before", BLUE, [m["sink_at_k_before"] for m in moves]),
                ("after", ORANGE, [m["sink_at_k_after"] for m in moves])],
               "mean sink score at key k")
        ax_move.set_title("moving the sink to position k", fontsize=MIN_FONT + 1)
    return Path(save(fig, Path(path)))


def _move_curves(ax: Any, moves: list[dict[str, Any]]) -> None:
    """The sink at k along each intervention's doses, one panel per intervention (split out
    of ``ax``), one line per k with its 95% interval; dashed: the sink at 0 before, dotted:
    half of it (what a moved sink must exceed)."""
    names = list(dict.fromkeys(m["intervention"] for m in moves))
    spec = ax.get_subplotspec()
    fig = ax.figure
    ax.remove()
    grid = spec.subgridspec(1, len(names))
    colors = [BLUE, ORANGE, GREEN, RED, *PALETTE[4:]]
    zero = moves[0]["sink_at_0_before"]
    for i, name in enumerate(names):
        a = fig.add_subplot(grid[0, i])
        mine = [m for m in moves if m["intervention"] == name]
        for j, k in enumerate(dict.fromkeys(m["k"] for m in mine)):
            pts = sorted((m for m in mine if m["k"] == k), key=lambda m: m["dose"])
            x = [m["dose"] for m in pts]
            iv = [m["intervals"]["sink_at_k_after"] for m in pts]
            y = [v["mean"] for v in iv]
            err = [[v["mean"] - v["low"] for v in iv], [v["high"] - v["mean"] for v in iv]]
            a.errorbar(x, y, yerr=err, marker="o", ms=3, capsize=2,
                       color=colors[j % len(colors)], label=f"k={k}")
        a.axhline(zero, color="black", ls="--", lw=0.8)
        a.axhline(0.5 * zero, color="black", ls=":", lw=0.8)
        if min(m["dose"] for m in mine) >= 1.0 and max(m["dose"] for m in mine) > 4:
            a.set_xscale("log", base=2)
        a.set_ylim(0, 1)
        a.set_title(name, fontsize=MIN_FONT)
        a.set_xlabel("dose", fontsize=MIN_FONT)
        a.tick_params(labelsize=MIN_FONT)
        if i == 0:
            a.set_ylabel("sink score at k", fontsize=MIN_FONT)
            a.legend(fontsize=MIN_FONT, frameon=False)
        a.grid(alpha=0.3)


@use_style
def plot_p0_circuit(result: dict[str, Any], path: str | Path, top: int = 8,
                    bars: int = 30) -> Path:
    """The P0-sink circuit graph (the ``top`` components by path effect -> the super neuron's
    MLP -> massive channel, and -> the sink; line width proportional to the absolute effect,
    with the widest line's value in the legend) above the ``bars`` largest path effects into
    the channel; minimal-circuit members in red. Drawn at page width."""
    import textwrap

    from matplotlib.lines import Line2D

    nodes, edges = result["nodes"], result["edges"]
    members = set(result["circuit"]["members"])
    fig, (ax_g, ax_b) = plt.subplots(2, 1, figsize=(PAGE_WIDTH, 8.0), layout="constrained",
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
    legend = []
    for key, to, color, what in (("via_mlp_to_channel", mlp, RED, f"via {mlp} into the channel"),
                                 ("direct_to_sink", sink, BLUE, "direct to the sink")):
        peak = peaks[key]
        for n in nodes:
            if n["name"] in pos and n[key]:
                (x0, y0), (x1, y1) = pos[n["name"]], pos[to]
                ax_g.plot([x0, x1], [y0, y1], color=color, alpha=0.75,
                          lw=0.4 + 5.6 * abs(n[key]) / peak, ls="-" if n[key] > 0 else "--")
        legend.append(Line2D([], [], color=color, lw=6.0,
                             label=f"{what}: widest line |effect| = {peak:.3g}"))
    legend.append(Line2D([], [], color=GRAY, ls="--", label="dashed: negative effect"))
    via_sink = max((abs(n["via_mlp_to_sink"] or 0.0) for n in nodes), default=0.0)
    arrows = ((mlp, channel, f"clean {result['clean']['via_mlp_to_channel']:.4g}"),
              (channel, sink, f"largest via {mlp}: {via_sink:.3g}"))
    for a, b, label in arrows:
        ax_g.annotate("", pos[b], pos[a], arrowprops={"arrowstyle": "->", "lw": 2})
        (xa, ya), (xb, yb) = pos[a], pos[b]
        ax_g.text((xa + xb) / 2, (ya + yb) / 2 + 0.05, label, ha="center", fontsize=MIN_FONT)
    for name, (x, y) in pos.items():
        ax_g.text(x, y, _label(name), ha="center", va="center", fontsize=MIN_FONT + 1,
                  bbox={"boxstyle": "round", "fc": "mistyrose" if name in members else "white"})
    ax_g.legend(handles=legend, fontsize=MIN_FONT, loc="upper center",
                bbox_to_anchor=(0.5, 0.0), ncol=1, frameon=False)
    ax_g.set(xlim=(-0.12, 1.15), ylim=(-0.1, 1.1))
    ax_g.set_title("\n".join(textwrap.wrap(
        f"{result['model']}: position-0 outputs path-patched to their position mean", 80)),
        fontsize=MIN_FONT + 1)
    ax_g.axis("off")
    biggest = sorted(nodes, key=lambda n: -abs(n["via_mlp_to_channel"] or 0.0))[:bars]
    x = np.arange(len(biggest))
    ax_b.bar(x, [n["via_mlp_to_channel"] or 0.0 for n in biggest],
             color=[RED if n["name"] in members else GRAY for n in biggest])
    ax_b.set_ylabel(f"{channel}: clean - patched\n(via {mlp})", fontsize=MIN_FONT)
    ax_b.set_title(f"the {len(biggest)} largest of {len(nodes)} path effects into the channel "
                   "(vermillion: the minimal circuit)", fontsize=MIN_FONT + 1)
    ax_b.set_xticks(x, [_label(n["name"]) for n in biggest], rotation=90, fontsize=MIN_FONT)
    ax_b.tick_params(labelsize=MIN_FONT)
    ax_b.axhline(0, color="black", lw=0.6)
    ax_b.grid(axis="y", alpha=0.3)
    return Path(save(fig, Path(path)))


def _label(name: str, n: int = 18) -> str:
    """A node's name for a figure: a group (``L0N239+141+...``) longer than ``n`` characters
    becomes its first member and how many more; a note in brackets (``sink @key0 (L20,21,...)``)
    goes on a line of its own, a long list in it shortened to its ends."""
    if len(name) <= n:
        return name
    if " (" in name and name.endswith(")"):
        head, note = name[:-1].split(" (", 1)
        items = note.split(",")
        if len(note) > n and len(items) > 2:
            note = f"{items[0]},…,{items[-1]}"
        return f"{_label(head, n)}\n({note})"
    parts = name.split("+")
    return f"{parts[0]} +{len(parts) - 1} more" if len(parts) > 1 else name[: n - 1] + "…"


def _peak(nodes: list[dict[str, Any]], key: str) -> float:
    return max((abs(n[key] or 0.0) for n in nodes), default=0.0) or 1.0


@use_style
def plot_query_bias_dose(data: dict[str, Any], path: str | Path, level: float = 0.95
                         ) -> Path | None:
    """The query-bias circuit dosed (``query_bias_dose``'s result): one panel per part (b_Q,
    b_Q . k_0 only, the layer-0 MLP at position 0, W_K's structure), two a row at page width:
    the sink heads' score at key 0 against the dose with its ``level`` interval over prompts,
    the clean dose (1) dotted and the verdict's threshold (half the clean score) dashed."""
    curves = data.get("curves") or {}
    if not curves:
        return None
    names = list(curves)
    cols = min(2, len(names))
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(PAGE_WIDTH, 2.9 * rows + 0.6), squeeze=False,
                             sharey=True, layout="constrained")
    for ax in axes.flat[len(names):]:
        ax.axis("off")
    for ax, name, color in zip(axes.flat, names, PALETTE, strict=False):
        pts = [r for r in curves[name]["rows"] if r["late_sink_score"]]
        x = [r["dose"] for r in pts]
        s = [r["late_sink_score"] for r in pts]
        ax.plot(x, [v["mean"] for v in s], marker="o", ms=3, color=color)
        ax.fill_between(x, [v["low"] for v in s], [v["high"] for v in s], color=color,
                        alpha=0.25, lw=0)
        ax.axvline(1.0, color=GRAY, lw=0.8, ls=":")
        clean = next((r["late_sink_score"] for r in pts if r["dose"] == 1.0), None)
        if clean is not None:
            ax.axhline(clean["mean"] / 2, color=GRAY, lw=0.8, ls="--")
        verdict = (data.get("verdicts") or {}).get(name, {}).get("verdict", "")
        ax.set_title(f"{name}: {verdict}" if verdict else name, fontsize=MIN_FONT + 1)
        ax.set(xlabel="dose (0 = removed, 1 = clean)", ylim=(0, 1))
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("sink heads' score at key 0")
    fig.suptitle(f"{data['model']}: query-bias circuit, dose-response ({level:.0%} intervals "
                 "over prompts; dashed: half the clean score)")
    return Path(save(fig, Path(path)))


@use_style
def plot_init_structure(result: dict[str, Any], path: str | Path) -> Path:
    """C7 in three panels: token preference by depth (each twin, own init scale, first seed,
    log scale); the last-layer-normalised contraction per layer (across / within a sequence,
    position 0 to later, dashed); the organisms' largest sink score over training per W_O init
    scale (mean and 95% interval over seeds)."""
    fig, (ax_pref, ax_con, ax_sink) = plt.subplots(1, 3, figsize=(PAGE_WIDTH, 3.2),
                                                   layout="constrained")
    for color, (name, twin) in zip(PALETTE, result["twins"].items(), strict=False):
        first = next(iter(twin["profiles"].values()))["scales"]["1"]
        depth = np.arange(1, len(first["preference"]) + 1) / len(first["preference"])
        ax_pref.plot(depth, [p["ratio"] for p in first["preference"]], color=color, label=name)
        layer = np.arange(len(first["contraction"])) / (len(first["contraction"]) - 1)
        con = first["contraction"]
        ax_con.plot(layer, [c["across"] for c in con], color=color, label=f"{name} across")
        ax_con.plot(layer, [c["within"] for c in con], color=color, ls=":")
        ax_con.plot(layer, [c["first_to_later"] for c in con], color=color, ls="--")
    ax_pref.set(yscale="log", xlabel="depth / total depth", ylabel="max / median next-token p",
                title="token preference at init")
    ax_con.set(xlabel="layer / total (0 = embeddings)", ylabel="mean pairwise cosine",
               title="across (-), within (:), pos 0 to later (--)")
    org = result["organisms"]
    for color, (key, arm) in zip(PALETTE, org["arms"].items(), strict=False):
        pts = [p for p in arm["over_training"] if p["step"] > 0]
        steps = [p["step"] for p in pts]
        ax_sink.plot(steps, [p["max_sink_score"]["mean"] for p in pts], color=color,
                     marker="o", ms=3, label=f"W_O init x{key}")
        ax_sink.fill_between(steps, [p["max_sink_score"]["low"] for p in pts],
                             [p["max_sink_score"]["high"] for p in pts], color=color, alpha=0.2)
    ax_sink.set(xscale="log", xlabel="step", ylabel="largest sink score (key 0)",
                title=f"{org['recipe']}, seeds {org['seeds']}")
    for ax in (ax_pref, ax_con, ax_sink):
        ax.legend(fontsize=MIN_FONT)
        ax.grid(alpha=0.3)
    return Path(save(fig, Path(path)))
