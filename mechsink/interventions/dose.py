"""Dose-response to saturation: scale a set by a grid of factors from 0 (full removal) to 3 and
read the whole curve, because effects in these models saturate (a massive channel at a quarter of
its size can still dominate the token's direction after RMSNorm, so one partial intervention can
show nothing).

:func:`dose_response` reads every dose (:func:`~mechsink.interventions.readout.measure_each`:
the doses as stacked copies of the prompts, batched forwards) and reads
each through one :class:`Frame` fixed on the clean run (its sink heads, the late layers, where the
channel is read): per dose the channel at position 0, the mean sink score of each layer's sink
heads, Gu et al.'s sink rate and the next-token loss, each with a 95% interval over prompts
(:func:`summarise`; :func:`~mechsink.interventions.stats.mean_interval`: Student's t below 64
prompts); the paired interval of the clean-minus-removed sink score; and the half-effect dose,
where the sink falls halfway from its clean value to its value at full removal, with the channel
there. Sink score and rate: Gu et al.
(2024), "When Attention Sink Emerges in Language Models".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.readout import Readout, measure_each
from mechsink.interventions.stats import (
    LEVEL,
    N_BOOT,
    Interval,
    mean_interval,
    paired_interval,
    resample_indices,
)
from mechsink.interventions.targets import Target
from mechsink.measure.cache import rounded
from mechsink.measure.sinks import DEFAULT_EPS, check_eps

DEFAULT_DOSES: tuple[float, ...] = (0.0, 0.02, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.5, 2.0, 3.0)


# --- the frame every dose is read through -------------------------------------------------------


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
                    "intervals": f"{LEVEL:.0%} interval of the mean over prompts "
                                 "(Student's t below 64 prompts, percentile bootstrap from "
                                 "64; each interval records its method and n)",
                    "drop": "paired interval over prompts of the per-prompt difference "
                            "clean - removed (factor 1 - factor 0) of the late-layer sink "
                            "score"}}


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


def late_values(r: Readout, frame: Frame) -> Tensor | None:
    """Per prompt, the mean sink score of the frame's sink heads in its late layers (None
    when it has none there)."""
    heads = [(lay, h) for lay, h in frame.sink_heads if lay in frame.late_layers]
    if not heads:
        return None
    return torch.stack([r.scores[:, lay, h] for lay, h in heads], 1).double().mean(1)


def summarise(r: Readout, frame: Frame, *, n_boot: int = N_BOOT, seed: int = 0) -> RunSummary:
    """Intervals over prompts for the channel, the late-layer sink score, each layer's sink
    heads, the sink rate and the loss."""
    def ci(v: Tensor) -> Interval:
        return mean_interval(v, n_boot=n_boot, seed=seed)

    n_layers = r.scores.shape[1]
    channel = None
    if frame.channel_layer is not None and r.channels.shape[-1]:
        channel = ci(r.channels[:, frame.channel_layer, 0])
    late = late_values(r, frame)
    per_layer = []
    for lay in range(n_layers):
        hs = [h for la, h in frame.sink_heads if la == lay]
        per_layer.append(ci(r.scores[:, lay, hs].double().mean(1)) if hs else None)
    rate = (r.scores > frame.eps).double().flatten(1).mean(1)
    by_layer = tuple(r.channels[..., 0].double().mean(0).tolist()) if r.channels.shape[-1] else ()
    return RunSummary(channel, None if late is None else ci(late), tuple(per_layer), ci(rate),
                      ci(r.loss), by_layer)


# --- dose-response -----------------------------------------------------------------------------


@dataclass(frozen=True)
class HalfEffect:
    """Where the late-layer sink score falls halfway from its clean value (factor 1) to its
    value at full removal (factor 0), read off the curve by linear interpolation; ``channel``
    is the channel at that dose (interpolated the same way), ``dose_interval`` the bootstrap
    interval of the dose over prompts (None where a resample never crosses). ``drop`` is the
    paired interval of the per-prompt clean-minus-removed late-layer sink score. ``dose`` is
    None when full removal does not lower the sink score (``drop`` reaches 0): a flat curve has
    no threshold."""

    dose: float | None
    channel: float | None
    clean: float
    floor: float
    dose_interval: tuple[float, float] | None
    drop: Interval | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"dose": rounded(self.dose), "channel": rounded(self.channel),
                "clean": rounded(self.clean), "floor": rounded(self.floor),
                "dose_interval": None if self.dose_interval is None else
                [rounded(v) for v in self.dose_interval],
                "drop": None if self.drop is None else self.drop.to_dict(),
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
    """Scale ``target`` by each factor in ``doses`` (must include 0 and 1), the doses as
    stacked copies of the prompts (batched forwards), and summarise each with intervals over
    the prompts (see :class:`Frame` for what is read). The sink heads are the clean run's
    (factor 1)."""
    grid = tuple(float(d) for d in doses)
    if 0.0 not in grid or 1.0 not in grid:
        raise BadInputError("doses must contain 0 (full removal) and 1 (clean): "
                            f"got {list(grid)}.")
    if len(set(grid)) != len(grid):
        raise BadInputError(f"doses repeat a factor: {list(grid)}.")
    check_eps(eps)
    readouts = tuple(measure_each(model, tokens, [[] if d == 1.0 else target.edits(d)
                                                  for d in grid],
                                  channels=target.channels, batch_size=batch_size))
    clean = readouts[grid.index(1.0)]
    frame = make_frame(model, clean, target.layers, eps=eps, late_layers=late_layers,
                       channel_layer=channel_layer)
    rows = tuple(summarise(r, frame, n_boot=n_boot, seed=seed) for r in readouts)
    return DoseResponse(target.description, grid, frame, rows,
                        _half_effect(grid, readouts, frame, n_boot, seed), readouts)


def _half_effect(
    grid: tuple[float, ...], readouts: Sequence[Readout], frame: Frame, n_boot: int, seed: int,
) -> HalfEffect:
    per_prompt = [late_values(r, frame) for r in readouts]
    if any(v is None for v in per_prompt):
        return HalfEffect(None, None, float("nan"), float("nan"), None)
    y = torch.stack(per_prompt, 1)  # type: ignore[arg-type]  # [batch, dose]
    ch = None
    if frame.channel_layer is not None and readouts[0].channels.shape[-1]:
        ch = torch.stack([r.channels[:, frame.channel_layer, 0] for r in readouts], 1).double()
    mean_y = y.mean(0).tolist()
    effect = paired_interval(y[:, grid.index(1.0)], y[:, grid.index(0.0)], n_boot=n_boot,
                             seed=seed)
    if effect.low <= 0:  # full removal does not lower the sink beyond the prompt noise:
        # there is no threshold to place (a flat curve would give a meaningless crossing)
        return HalfEffect(None, None, mean_y[grid.index(1.0)], mean_y[grid.index(0.0)], None,
                          effect)
    dose, chan = half_effect_dose(grid, mean_y, None if ch is None else ch.mean(0).tolist())
    boots = []
    for idx in resample_indices(y.shape[0], min(n_boot, 500), seed):
        d, _ = half_effect_dose(grid, y[idx].mean(0).tolist())
        if d is not None:
            boots.append(d)
    interval = None
    if dose is not None and len(boots) >= 0.9 * min(n_boot, 500):
        q = torch.quantile(torch.tensor(boots, dtype=torch.float64),
                           torch.tensor([(1 - LEVEL) / 2, 1 - (1 - LEVEL) / 2],
                                        dtype=torch.float64))
        interval = (float(q[0]), float(q[1]))
    return HalfEffect(dose, chan, mean_y[grid.index(1.0)], mean_y[grid.index(0.0)], interval,
                      effect)
