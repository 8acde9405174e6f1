"""The causal chain *super neurons -> massive channel -> sink*, measured to saturation.

Effects in these models saturate: a massive channel at a quarter of its size can still dominate
the token's direction after RMSNorm, so one partial intervention can show nothing. This module
pushes every intervention to full removal and reads the whole curve:

- :func:`dose_response`: scale a *set* (neurons of one MLP, residual channels, a direction) by a
  grid of factors from 0 (full removal) to 3, and record per dose the channel at position 0,
  the mean sink score of each layer's sink heads, Gu et al.'s sink rate and the next-token
  loss, each with a 95% bootstrap interval over prompts; and the half-effect dose, where the
  sink falls halfway from its clean value to its value at full removal, with the channel there.
- :func:`channel_surgery` / :func:`direction_surgery`: set the massive channel(s) at position 0,
  or the component along a direction, to its median over positions 1.. (what an ordinary token
  carries), at one layer or at every layer from ``l`` on; :func:`measure` reads the same
  quantities as a dose.
- :func:`key_logit_split`: the attention logit ``q_i . k_j`` of a head split into the parts of
  the key made by the massive channel(s) and by the rest of position ``j``'s normalised
  residual, the key bias, and the rotary position term; the parts sum to the model's own logit.

Interventions are declared (:class:`mechsink.interventions.edits.Intervention`) and always removed.
Sink score and rate: Gu et al. (2024), "When Attention Sink Emerges in Language Models"; super
neurons: Yu et al. (2024), "The Super Weight in Large Language Models"; massive activations:
Sun et al. (2024), "Massive Activations in Large Language Models".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.edits import Intervention, ablate, applied
from mechsink.measure._cache import rounded
from mechsink.measure.sinks import DEFAULT_EPS, check_eps, sink_score
from mechsink.model import (
    act_name,
    has_hook,
    key_bias,
    key_weights,
    n_kv_heads,
    write_in_place,
)

DEFAULT_DOSES: tuple[float, ...] = (0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0)
LEVEL = 0.95
N_BOOT = 2000


# --- bootstrap intervals over prompts ----------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """A mean over prompts with its percentile-bootstrap interval."""

    mean: float
    low: float
    high: float

    def overlaps(self, other: Interval) -> bool:
        return not (self.high < other.low or other.high < self.low)

    def to_dict(self) -> dict[str, float | None]:
        return {"mean": rounded(self.mean), "low": rounded(self.low), "high": rounded(self.high)}

    def __str__(self) -> str:
        return f"{self.mean:.3g} [{self.low:.3g}, {self.high:.3g}]"


def _resamples(n: int, n_boot: int, seed: int) -> Int[Tensor, "boot n"]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(n, (n_boot, n), generator=gen)


def bootstrap_interval(
    values: Float[Tensor, " n"] | Sequence[float],
    *,
    level: float = LEVEL,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> Interval:
    """Mean of ``values`` (one per prompt) and the percentile-bootstrap ``level`` interval of
    that mean (Efron & Tibshirani 1993, "An Introduction to the Bootstrap"): resample the
    prompts with replacement ``n_boot`` times."""
    v = torch.as_tensor(values, dtype=torch.float64).flatten()
    if v.numel() == 0:
        raise BadInputError("bootstrap_interval needs at least one value.")
    if not 0.0 < level < 1.0:
        raise BadInputError(f"level must lie strictly between 0 and 1, got {level!r}.")
    means = v[_resamples(v.numel(), n_boot, seed)].mean(1)
    alpha = (1.0 - level) / 2
    low, high = torch.quantile(means, torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64))
    return Interval(float(v.mean()), float(low), float(high))


# --- what a dose scales -------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """A set a dose scales: ``edits(factor)`` gives the interventions for one factor; ``layers``
    are the blocks edited (later blocks are the "late" layers); ``channels`` the residual
    channels it is about (read out at position 0)."""

    description: str
    edits: Callable[[float], list[Intervention]]
    layers: tuple[int, ...]
    channels: tuple[int, ...] = ()


def neuron_set(
    model: Any, layer: int, neurons: Sequence[int], *, channels: Sequence[int] = (),
    positions: Sequence[int] = (0,),
) -> Target:
    """Scale the down-projection inputs (``mlp.hook_post``) of ``neurons`` at ``positions``."""
    units = [int(n) for n in neurons]
    if not units:
        raise BadInputError("neuron_set needs at least one neuron.")
    pos = list(positions)

    def edits(f: float) -> list[Intervention]:
        return [ablate(model, "mlp.hook_post", layer, mode="scale", scale=f, units=units,
                       positions=pos)]

    edits(1.0)  # checks layer and neuron indices now, before any work
    return Target(f"neurons {units} of MLP {layer} at positions {pos}", edits, (layer,),
                  tuple(int(c) for c in channels))


def neuron_sets(
    model: Any, sets: dict[int, Sequence[int]], *, channels: Sequence[int] = (),
    positions: Sequence[int] = (0,),
) -> Target:
    """Scale several MLPs' neurons at once: ``sets`` maps a block to its neurons (e.g. every
    complete set that writes a channel, when more than one block builds it)."""
    if not sets:
        raise BadInputError("neuron_sets needs at least one block.")
    parts = [neuron_set(model, lay, units, positions=positions)
             for lay, units in sorted(sets.items())]

    def edits(f: float) -> list[Intervention]:
        return [e for p in parts for e in p.edits(f)]

    what = "; ".join(f"MLP {lay}: {list(units)}" for lay, units in sorted(sets.items()))
    return Target(f"neurons ({what}) at positions {list(positions)}", edits,
                  tuple(sorted(sets)), tuple(int(c) for c in channels))


def _check_channels(model: Any, channels: Sequence[int]) -> list[int]:
    d = int(model.cfg.d_model)
    out = [int(c) for c in channels]
    if not out or not all(0 <= c < d for c in out):
        raise BadInputError(f"channels {list(channels)} must be a non-empty list in 0..{d - 1}.")
    return out


def _check_layers(model: Any, layers: Sequence[int]) -> list[int]:
    n = int(model.cfg.n_layers)
    out = sorted({int(x) for x in layers})
    if not out or not all(0 <= x < n for x in out):
        raise BadInputError(f"layers {list(layers)} must be a non-empty list in 0..{n - 1}.")
    return out


def _residual_edit(
    layer: int, positions: Sequence[int], fn: Callable[[Tensor], Tensor], description: str,
) -> Intervention:
    """An edit of ``hook_resid_pre`` at ``layer`` (the block's input: attention, MLP and the
    skip all see it), written in place as the bridge needs."""
    pos = list(positions)

    def hook(act: Tensor, hook: Any) -> Tensor:
        new = act.clone()
        new[:, pos] = fn(act[:, pos])
        return write_in_place(act, new)

    return Intervention(act_name("resid_pre", layer), hook, description)


def channel_set(
    model: Any, channels: Sequence[int], layers: Sequence[int], *,
    positions: Sequence[int] = (0,),
) -> Target:
    """Scale residual ``channels`` at ``positions`` in the input of each of ``layers``."""
    chans, lays = _check_channels(model, channels), _check_layers(model, layers)

    def edits(f: float) -> list[Intervention]:
        def fn(x: Tensor) -> Tensor:
            y = x.clone()
            y[..., chans] = x[..., chans] * f
            return y

        return [_residual_edit(lay, positions, fn, f"channels {chans} x{f} at positions "
                               f"{list(positions)}, input of block {lay}") for lay in lays]

    return Target(f"residual channels {chans} at positions {list(positions)}, input of blocks "
                  f"{lays}", edits, tuple(lays), tuple(chans))


def direction_set(
    model: Any, direction: Float[Tensor, " d_model"], layers: Sequence[int], *,
    positions: Sequence[int] = (0,), channels: Sequence[int] = (), name: str = "a direction",
) -> Target:
    """Scale the component of the residual along ``direction`` (normalised) at ``positions``
    in the input of each of ``layers``: ``x + (f - 1) (x . u) u``."""
    lays = _check_layers(model, layers)
    u = _unit(model, direction)

    def edits(f: float) -> list[Intervention]:
        def fn(x: Tensor) -> Tensor:
            uu = u.to(x.device, x.dtype)
            return x + (f - 1.0) * (x @ uu)[..., None] * uu

        return [_residual_edit(lay, positions, fn, f"{name} x{f} at positions "
                               f"{list(positions)}, input of block {lay}") for lay in lays]

    return Target(f"{name} at positions {list(positions)}, input of blocks {lays}", edits,
                  tuple(lays), tuple(int(c) for c in channels))


def _unit(model: Any, direction: Tensor) -> Tensor:
    d = int(model.cfg.d_model)
    u = torch.as_tensor(direction, dtype=torch.float32).flatten()
    if u.numel() != d or not bool(torch.isfinite(u).all()) or float(u.norm()) == 0.0:
        raise BadInputError(f"direction must be a finite non-zero vector of length {d}.")
    return u / u.norm()


# --- surgery: position 0 made ordinary along a channel or a direction ---------------------------


def _surgery_layers(model: Any, layer: int, every_layer_from: bool) -> list[int]:
    _check_layers(model, [layer])
    return list(range(layer, int(model.cfg.n_layers))) if every_layer_from else [layer]


def channel_surgery(
    model: Any, channels: Sequence[int], layer: int, *, every_layer_from: bool = False,
    position: int = 0,
) -> list[Intervention]:
    """Set ``channels`` at ``position`` to their median over the sequence's positions after it
    (an ordinary token's value), in the input of ``layer`` (or of every block from ``layer``
    on: then no later block can rebuild the channel)."""
    chans = _check_channels(model, channels)
    out = []
    for lay in _surgery_layers(model, layer, every_layer_from):
        def hook(act: Tensor, hook: Any, _c: list[int] = chans) -> Tensor:
            if act.shape[1] < position + 2:
                raise BadInputError("channel surgery needs a position after the edited one.")
            new = act.clone()
            med = act[:, position + 1:, _c].median(dim=1).values
            new[:, position, _c] = med
            return write_in_place(act, new)

        out.append(Intervention(act_name("resid_pre", lay), hook,
                                f"channels {chans} at position {position} set to their median "
                                f"over later positions, input of block {lay}"))
    return out


def direction_surgery(
    model: Any, direction: Float[Tensor, " d_model"], layer: int, *,
    every_layer_from: bool = False, position: int = 0,
) -> list[Intervention]:
    """Replace the component along ``direction`` at ``position`` by its median over the later
    positions: ``x0 - (x0 . u) u + median_p(x_p . u) u``."""
    u = _unit(model, direction)
    out = []
    for lay in _surgery_layers(model, layer, every_layer_from):
        def hook(act: Tensor, hook: Any) -> Tensor:
            if act.shape[1] < position + 2:
                raise BadInputError("direction surgery needs a position after the edited one.")
            uu = u.to(act.device, act.dtype)
            proj = act @ uu  # [batch, pos]
            med = proj[:, position + 1:].median(dim=1).values
            new = act.clone()
            new[:, position] = act[:, position] + (med - proj[:, position])[:, None] * uu
            return write_in_place(act, new)

        out.append(Intervention(act_name("resid_pre", lay), hook,
                                f"direction at position {position} set to its median over "
                                f"later positions, input of block {lay}"))
    return out


@torch.no_grad()
def top_direction(
    model: Any, tokens: Int[Tensor, "batch pos"], layer: int, position: int = 0
) -> Float[Tensor, " d_model"]:
    """The top right-singular vector of the residual stream entering ``layer`` at
    ``position`` over the prompts (uncentred: the direction position 0's state points in),
    signed so that its mean projection is positive."""
    _check_layers(model, [layer])
    name = act_name("resid_pre", layer)
    _, cache = model.run_with_cache(tokens, names_filter=[name], return_type=None)
    x = cache[name][:, position].double()
    u = torch.linalg.svd(x, full_matrices=False).Vh[0]
    if float((x @ u).mean()) < 0:
        u = -u
    return u.float().cpu()


# --- one measured run ------------------------------------------------------------------------


@dataclass(frozen=True)
class Readout:
    """Per-prompt measurements of one run (with or without edits).

    ``channels``: residual stream after each block at position 0 in the tracked channels;
    ``scores``: Gu et al.'s sink score at key 0 (queries i >= 0) per layer and head;
    ``loss``: mean next-token cross-entropy per prompt.
    """

    channels: Float[Tensor, "batch layer channel"]
    scores: Float[Tensor, "batch layer head"]
    loss: Float[Tensor, " batch"]


@torch.no_grad()
def measure(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    edits: Sequence[Intervention] = (),
    *,
    channels: Sequence[int] = (),
    batch_size: int = 8,
) -> Readout:
    """Run ``tokens`` with ``edits`` in place (removed afterwards) and read the channels at
    position 0, the sink scores at key 0 and the next-token loss, per prompt."""
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise BadInputError("tokens must be [batch, pos] with at least two positions.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BadInputError(f"batch_size must be a positive integer, got {batch_size!r}.")
    chans = [int(c) for c in channels]
    n_layers = int(model.cfg.n_layers)
    pattern_names = [act_name("pattern", lay) for lay in range(n_layers)]
    resid_names = [act_name("resid_post", lay) for lay in range(n_layers)] if chans else []
    ch_parts, sc_parts, loss_parts = [], [], []
    with applied(model, list(edits)):
        for start in range(0, tokens.shape[0], batch_size):
            chunk = tokens[start:start + batch_size]
            logits, cache = model.run_with_cache(
                chunk, names_filter=pattern_names + resid_names)
            sc_parts.append(torch.stack([sink_score(cache[n].float(), 0) for n in pattern_names],
                                        1).cpu())
            if chans:
                ch_parts.append(torch.stack([cache[n][:, 0, chans].float()
                                             for n in resid_names], 1).cpu())
            target = chunk[:, 1:].to(logits.device)
            ce = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), target.flatten(),
                                 reduction="none").view(target.shape)
            loss_parts.append(ce.mean(1).cpu())
            del cache, logits
    n = tokens.shape[0]
    ch = torch.cat(ch_parts) if chans else torch.zeros(n, n_layers, 0)
    return Readout(ch, torch.cat(sc_parts), torch.cat(loss_parts))


# --- summaries with intervals -----------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """What the chain's verdicts read: the clean run's sink heads, the late layers, where the
    channel is read, and the sink threshold. Fixed once, so every dose reads the same heads."""

    sink_heads: tuple[tuple[int, int], ...]
    late_layers: tuple[int, ...]
    channel_layer: int | None
    eps: float

    def to_dict(self) -> dict[str, Any]:
        return {"sink_heads": [list(h) for h in self.sink_heads],
                "late_layers": list(self.late_layers), "channel_layer": self.channel_layer,
                "eps": self.eps,
                "definitions": {
                    "sink_heads": "heads whose clean Gu sink score at key 0 (mean over prompts) "
                                  "exceeds eps",
                    "late_sink_score": "per prompt, mean Gu sink score of the sink heads in the "
                                       "late layers (after the last edited block)",
                    "sink_rate": "Gu et al.: fraction of all (layer, head) with score > eps, "
                                 "per prompt",
                    "channel": "residual stream after block channel_layer at position 0 "
                               "(first tracked channel)",
                    "intervals": f"{LEVEL:.0%} percentile bootstrap over prompts"}}


def make_frame(
    model: Any, clean: Readout, edited_layers: Sequence[int], *, eps: float = DEFAULT_EPS,
    late_layers: Sequence[int] | None = None, channel_layer: int | None = None,
) -> Frame:
    """Sink heads from the clean run; late layers default to the blocks after the last edited
    one; the channel is read where its clean magnitude peaks at or after the edited blocks."""
    check_eps(eps)
    n_layers = int(model.cfg.n_layers)
    last = max(edited_layers) if edited_layers else -1
    late = tuple(late_layers) if late_layers is not None else tuple(range(last + 1, n_layers))
    if not late:
        late = (n_layers - 1,)
    mean = clean.scores.mean(0)
    heads = tuple((int(lay), int(h)) for lay, h in torch.nonzero(mean > eps).tolist())
    if channel_layer is None and clean.channels.shape[-1]:
        mag = clean.channels[..., 0].abs().mean(0)
        start = max(last, 0)
        channel_layer = start + int(mag[start:].argmax())
    return Frame(heads, late, channel_layer, float(eps))


@dataclass(frozen=True)
class RunSummary:
    """One run read through a :class:`Frame`, every figure with its interval over prompts."""

    channel: Interval | None
    late_sink_score: Interval | None
    layer_sink_score: tuple[Interval | None, ...]
    sink_rate: Interval
    loss: Interval
    channel_by_layer: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        def d(x: Interval | None) -> dict[str, Any] | None:
            return None if x is None else x.to_dict()

        return {"channel": d(self.channel), "late_sink_score": d(self.late_sink_score),
                "layer_sink_score": [d(x) for x in self.layer_sink_score],
                "sink_rate": self.sink_rate.to_dict(), "loss": self.loss.to_dict(),
                "channel_by_layer": [rounded(v) for v in self.channel_by_layer]}


def _late_values(r: Readout, frame: Frame) -> Tensor | None:
    heads = [(lay, h) for lay, h in frame.sink_heads if lay in frame.late_layers]
    if not heads:
        return None
    return torch.stack([r.scores[:, lay, h] for lay, h in heads], 1).double().mean(1)


def summarise(r: Readout, frame: Frame, *, n_boot: int = N_BOOT, seed: int = 0) -> RunSummary:
    """Intervals over prompts for the channel, the late-layer sink score, each layer's sink
    heads, the sink rate and the loss."""
    def ci(v: Tensor) -> Interval:
        return bootstrap_interval(v, n_boot=n_boot, seed=seed)

    n_layers = r.scores.shape[1]
    channel = None
    if frame.channel_layer is not None and r.channels.shape[-1]:
        channel = ci(r.channels[:, frame.channel_layer, 0])
    late = _late_values(r, frame)
    per_layer = []
    for lay in range(n_layers):
        hs = [h for la, h in frame.sink_heads if la == lay]
        per_layer.append(ci(r.scores[:, lay, hs].double().mean(1)) if hs else None)
    rate = (r.scores > frame.eps).double().flatten(1).mean(1)
    by_layer = tuple(r.channels[..., 0].double().mean(0).tolist()) if r.channels.shape[-1] else ()
    return RunSummary(channel, None if late is None else ci(late), tuple(per_layer), ci(rate),
                      ci(r.loss), by_layer)


# --- dose-response ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HalfEffect:
    """Where the late-layer sink score falls halfway from its clean value (factor 1) to its
    value at full removal (factor 0), read off the curve by linear interpolation; ``channel``
    is the channel at that dose (interpolated the same way), ``dose_interval`` the bootstrap
    interval of the dose over prompts (None where a resample never crosses). ``dose`` is None
    when full removal does not lower the sink score (the bootstrap interval of the per-prompt
    clean-minus-removed difference reaches 0): a flat curve has no threshold."""

    dose: float | None
    channel: float | None
    clean: float
    floor: float
    dose_interval: tuple[float, float] | None

    def to_dict(self) -> dict[str, Any]:
        return {"dose": rounded(self.dose), "channel": rounded(self.channel),
                "clean": rounded(self.clean), "floor": rounded(self.floor),
                "dose_interval": None if self.dose_interval is None else
                [rounded(v) for v in self.dose_interval],
                "definition": "dose in [0, 1] where the late-layer sink score crosses "
                              "(clean + floor) / 2, clean = factor 1, floor = factor 0"}


def half_effect_dose(
    doses: Sequence[float], y: Sequence[float], channel: Sequence[float] | None = None,
) -> tuple[float | None, float | None]:
    """The dose in [0, 1] at which ``y`` first crosses halfway between y(0) and y(1), walking
    up from 0, by linear interpolation; and ``channel`` interpolated at that dose. None when
    the grid has no dose strictly between 0 and 1."""
    pts = sorted((float(d), float(v), None if channel is None else float(channel[i]))
                 for i, (d, v) in enumerate(zip(doses, y, strict=True)) if 0.0 <= d <= 1.0)
    ds = [p[0] for p in pts]
    if 0.0 not in ds or 1.0 not in ds:
        raise BadInputError("the dose grid must contain 0 (full removal) and 1 (clean).")
    y0, y1 = pts[0][1], pts[-1][1]
    half = (y0 + y1) / 2
    if len(pts) < 3 or y0 == y1 or not (math.isfinite(y0) and math.isfinite(y1)):
        return None, None  # no dose between 0 and 1: the curve cannot place a threshold
    for (d0, v0, c0), (d1, v1, c1) in zip(pts, pts[1:], strict=False):
        if (v0 - half) * (v1 - half) <= 0 and v0 != v1:
            t = (half - v0) / (v1 - v0)
            dose = d0 + t * (d1 - d0)
            ch = None if c0 is None or c1 is None else c0 + t * (c1 - c0)
            return dose, ch
    return None, None


@dataclass(frozen=True)
class DoseResponse:
    """The whole curve of one target: per dose a :class:`RunSummary`, and the half effect."""

    target: str
    doses: tuple[float, ...]
    frame: Frame
    rows: tuple[RunSummary, ...]
    half_effect: HalfEffect
    readouts: tuple[Readout, ...] = field(repr=False, default=())

    def row(self, dose: float) -> RunSummary:
        return self.rows[self.doses.index(dose)]

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "frame": self.frame.to_dict(),
                "doses": list(self.doses),
                "rows": [{"dose": d, **r.to_dict()} for d, r in zip(self.doses, self.rows,
                                                                     strict=True)],
                "half_effect": self.half_effect.to_dict()}


def dose_response(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    target: Target,
    doses: Sequence[float] = DEFAULT_DOSES,
    *,
    eps: float = DEFAULT_EPS,
    late_layers: Sequence[int] | None = None,
    channel_layer: int | None = None,
    n_boot: int = N_BOOT,
    seed: int = 0,
    batch_size: int = 8,
) -> DoseResponse:
    """Scale ``target`` by each factor in ``doses`` (must include 0 and 1), one forward per
    dose, and summarise each with intervals over the prompts (see :class:`Frame` for what is
    read). The sink heads are the clean run's (factor 1)."""
    grid = tuple(float(d) for d in doses)
    if 0.0 not in grid or 1.0 not in grid:
        raise BadInputError("doses must contain 0 (full removal) and 1 (clean): "
                            f"got {list(grid)}.")
    if len(set(grid)) != len(grid):
        raise BadInputError(f"doses repeat a factor: {list(grid)}.")
    check_eps(eps)
    readouts = tuple(measure(model, tokens, [] if d == 1.0 else target.edits(d),
                             channels=target.channels, batch_size=batch_size) for d in grid)
    clean = readouts[grid.index(1.0)]
    frame = make_frame(model, clean, target.layers, eps=eps, late_layers=late_layers,
                       channel_layer=channel_layer)
    rows = tuple(summarise(r, frame, n_boot=n_boot, seed=seed) for r in readouts)
    return DoseResponse(target.description, grid, frame, rows,
                        _half_effect(grid, readouts, frame, n_boot, seed), readouts)


def _half_effect(
    grid: tuple[float, ...], readouts: Sequence[Readout], frame: Frame, n_boot: int, seed: int,
) -> HalfEffect:
    per_prompt = [_late_values(r, frame) for r in readouts]
    if any(v is None for v in per_prompt):
        return HalfEffect(None, None, float("nan"), float("nan"), None)
    y = torch.stack(per_prompt, 1)  # type: ignore[arg-type]  # [batch, dose]
    ch = None
    if frame.channel_layer is not None and readouts[0].channels.shape[-1]:
        ch = torch.stack([r.channels[:, frame.channel_layer, 0] for r in readouts], 1).double()
    mean_y = y.mean(0).tolist()
    effect = bootstrap_interval(y[:, grid.index(1.0)] - y[:, grid.index(0.0)], n_boot=n_boot,
                                seed=seed)
    if effect.low <= 0:  # full removal does not lower the sink beyond the prompt noise:
        # there is no threshold to place (a flat curve would give a meaningless crossing)
        return HalfEffect(None, None, mean_y[grid.index(1.0)], mean_y[grid.index(0.0)], None)
    dose, chan = half_effect_dose(grid, mean_y, None if ch is None else ch.mean(0).tolist())
    boots = []
    for idx in _resamples(y.shape[0], min(n_boot, 500), seed):
        d, _ = half_effect_dose(grid, y[idx].mean(0).tolist())
        if d is not None:
            boots.append(d)
    interval = None
    if dose is not None and len(boots) >= 0.9 * min(n_boot, 500):
        q = torch.quantile(torch.tensor(boots, dtype=torch.float64),
                           torch.tensor([(1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2],
                                        dtype=torch.float64))
        interval = (float(q[0]), float(q[1]))
    return HalfEffect(dose, chan, mean_y[grid.index(1.0)], mean_y[grid.index(0.0)], interval)


# --- key-logit decomposition -----------------------------------------------------------------


@dataclass(frozen=True)
class LogitParts:
    """Mean over prompts and queries of one key's attention logit and its parts.

    ``massive``/``rest``: the key made by the massive channels / the other coordinates of the
    key position's normalised residual (the key projection's input), met by the query without
    rotation; ``key_bias``: ``b_K``'s part; ``rotary``: the logit minus the unrotated
    ``q . k`` (what the rotary position embedding adds); ``total``: the sum of the parts;
    ``model``: the model's own ``hook_attn_scores``; ``max_error``: max |total - model|.
    """

    key: int
    massive: float
    rest: float
    key_bias: float
    rotary: float
    total: float
    model: float
    max_error: float

    def to_dict(self) -> dict[str, Any]:
        return {k: (rounded(v) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class KeyLogitSplit:
    """The logit split of one head for key 0 and an ordinary key ``j`` (queries ``i >= j``)."""

    layer: int
    head: int
    channels: tuple[int, ...]
    queries: tuple[int, int]
    sink_key: LogitParts
    other_key: LogitParts

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "head": self.head, "channels": list(self.channels),
                "queries": list(self.queries), "key_0": self.sink_key.to_dict(),
                "key_j": self.other_key.to_dict(),
                "gap": {p: rounded(getattr(self.sink_key, p) - getattr(self.other_key, p))
                        for p in ("massive", "rest", "key_bias", "rotary", "total")}}


def _key_input_name(model: Any, layer: int) -> str:
    """The key projection's input (the normalised residual): ``ln1.hook_out`` on a
    TransformerBridge, ``ln1.hook_normalized`` (gain applied) on a HookedTransformer."""
    for suffix in ("ln1.hook_out", "ln1.hook_normalized"):
        if has_hook(model, act_name(suffix, layer)):
            return act_name(suffix, layer)
    raise BadInputError(f"block {layer} has no normalised-residual hook before attention: "
                        "key-logit decomposition needs a pre-norm model.")


def _as_bphd(t: Tensor, ref: Tensor) -> Tensor:
    """``t`` in ``[batch, pos, head, d]`` layout; ``ref`` is a tensor known to be in it (the
    rotated one, equal to ``t`` at position 0 where the rotation is the identity)."""
    if t.shape == ref.shape and torch.allclose(t[:, 0], ref[:, 0], atol=1e-4, rtol=1e-4):
        return t
    tt = t.transpose(1, 2)
    if tt.shape == ref.shape and torch.allclose(tt[:, 0], ref[:, 0], atol=1e-4, rtol=1e-4):
        return tt
    raise BadInputError("could not line up the normalised q/k with the rotated ones: this "
                        "attention layout is not supported by key_logit_split.")


@torch.no_grad()
def key_logit_split(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    layer: int,
    head: int,
    channels: Sequence[int],
    *,
    other_key: int | None = None,
    tol: float = 1e-4,
) -> KeyLogitSplit:
    """Split head ``(layer, head)``'s logit ``q_i . k_j`` (scaled as the model scales it) for
    key 0 and an ordinary key ``j`` (default: the middle position), over queries ``i >= j``.

    The key is linear in the key input ``x_j`` (``k = x_j W_K + b_K``), then, where the model
    has one, a key norm (linear once its per-token scale is fixed at the value the model used)
    and a rotation. The parts are ``x_j[channels] W_K`` and the rest of ``x_j`` (and ``b_K``)
    carried through the fixed-scale norm and met by the unrotated query; the rotary term is the
    model's logit minus the unrotated ``q . k``. Raises if the parts miss the model's own
    ``hook_attn_scores`` by more than ``tol`` (relative to the logit's scale).
    """
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if not 0 <= layer < n_layers or not 0 <= head < n_heads:
        raise BadInputError(f"head L{layer}H{head} is out of range ({n_layers} layers, "
                            f"{n_heads} heads).")
    chans = _check_channels(model, channels)
    soft_cap = getattr(model.cfg, "attn_scores_soft_cap", -1.0) or -1.0
    if soft_cap > 0:
        raise BadInputError("this model soft-caps its attention scores: the logit is not a "
                            "sum of parts.")
    n_pos = tokens.shape[1]
    j = n_pos // 2 if other_key is None else int(other_key)
    if not 0 < j < n_pos:
        raise BadInputError(f"other_key must lie in 1..{n_pos - 1}, got {j}.")
    group = head // (n_heads // n_kv_heads(model))

    def name(s: str) -> str:
        return act_name(s, layer)

    x_name = _key_input_name(model, layer)
    wanted = [x_name, name("attn.hook_q"), name("attn.hook_k"), name("attn.hook_attn_scores")]
    optional = [name(s) for s in ("attn.hook_rot_q", "attn.hook_rot_k", "attn.hook_q_normed",
                                  "attn.hook_k_normed") if has_hook(model, name(s))]
    _, cache = model.run_with_cache(tokens, names_filter=wanted + optional, return_type=None)
    x = cache[x_name].double()  # [batch, pos, d_model]
    w_k = key_weights(model)[layer, group].double().to(x.device)  # [d_model, d_head]
    b_k = key_bias(model)
    b = (b_k[layer, group].detach().double().to(x.device) if b_k is not None
         else torch.zeros(w_k.shape[1], dtype=torch.float64, device=x.device))
    k_model = cache[name("attn.hook_k")][:, :, group].double()
    k_raw = x @ w_k + b
    scale_ref = float(k_model.abs().max()) or 1.0
    if float((k_raw - k_model).abs().max()) > 1e-3 * scale_ref:
        raise BadInputError(f"{x_name} @ W_K does not give the model's keys at layer {layer}: "
                            "this model's key projection is not supported.")
    rot_q = cache[name("attn.hook_rot_q")] if name("attn.hook_rot_q") in cache else None
    rot_k = cache[name("attn.hook_rot_k")] if name("attn.hook_rot_k") in cache else None
    q = cache[name("attn.hook_q")]
    k_all = cache[name("attn.hook_k")]
    if name("attn.hook_q_normed") in cache:
        q = _as_bphd(cache[name("attn.hook_q_normed")], rot_q if rot_q is not None else q)
    if name("attn.hook_k_normed") in cache:
        k_all = _as_bphd(cache[name("attn.hook_k_normed")], rot_k if rot_k is not None else k_all)
    q_unrot = q[:, :, head].double()  # [batch, pos, d_head]
    k_unrot = k_all[:, :, group].double()
    q_fin = (rot_q if rot_q is not None else q)[:, :, head].double()
    k_fin = (rot_k if rot_k is not None else k_all)[:, :, group].double()
    # the key norm with its scale fixed: elementwise factor k_unrot / k_raw (1 without a norm)
    factor = torch.where(k_model != 0, k_unrot / torch.where(k_model != 0, k_model, 1.0),
                         torch.zeros_like(k_model))
    if name("attn.hook_k_normed") not in cache:
        factor = torch.ones_like(k_model)
    attn_scale = float(getattr(model.cfg, "attn_scale", -1.0) or -1.0)
    use_scale = bool(getattr(model.cfg, "use_attn_scale", True))
    s = (1.0 / attn_scale if attn_scale > 0 else 1.0 / math.sqrt(w_k.shape[1])) if use_scale \
        else 1.0
    scores = cache[name("attn.hook_attn_scores")][:, head].double()  # [batch, query, key]
    mask = torch.zeros(x.shape[-1], dtype=torch.bool, device=x.device)
    mask[chans] = True

    def parts_for(key: int) -> LogitParts:
        queries = torch.arange(j, n_pos, device=x.device)
        xk = x[:, key]  # [batch, d_model]
        k_mass = (xk * mask) @ w_k * factor[:, key]
        k_rest = (xk * ~mask) @ w_k * factor[:, key]
        k_bias = b[None] * factor[:, key]
        qi = q_unrot[:, queries]  # [batch, nq, d_head]
        massive = s * torch.einsum("bqe,be->bq", qi, k_mass)
        rest = s * torch.einsum("bqe,be->bq", qi, k_rest)
        bias = s * torch.einsum("bqe,be->bq", qi, k_bias)
        total = s * torch.einsum("bqe,be->bq", q_fin[:, queries], k_fin[:, key])
        rotary = total - massive - rest - bias
        own = scores[:, queries, key]
        err = float((total - own).abs().max())
        if err > tol * max(1.0, float(own.abs().max())):
            raise BadInputError(f"the rebuilt logit of L{layer}H{head} misses the model's "
                                f"hook_attn_scores by {err:.3g}: this attention is not "
                                "supported by key_logit_split.")
        return LogitParts(key, float(massive.mean()), float(rest.mean()), float(bias.mean()),
                          float(rotary.mean()), float(total.mean()), float(own.mean()), err)

    return KeyLogitSplit(layer, head, tuple(chans), (j, n_pos - 1), parts_for(0), parts_for(j))


__all__ = [
    "DEFAULT_DOSES",
    "DoseResponse",
    "Frame",
    "HalfEffect",
    "Interval",
    "KeyLogitSplit",
    "LogitParts",
    "Readout",
    "RunSummary",
    "Target",
    "bootstrap_interval",
    "channel_set",
    "channel_surgery",
    "direction_set",
    "direction_surgery",
    "dose_response",
    "half_effect_dose",
    "key_logit_split",
    "make_frame",
    "measure",
    "neuron_set",
    "neuron_sets",
    "summarise",
    "top_direction",
]
