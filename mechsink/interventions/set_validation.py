"""Super-neuron sets validated causally: a set named as the writer of a massive channel is only a
super-neuron set if zeroing it moves the channel and the sink, beyond what zeroing as many other
neurons of the same block does.

For every set (one block, one channel) :func:`validate_sets` runs the prompts three ways: clean,
the set's neurons zeroed at position 0, and a same-size random set of the same block (none of
the set's neurons) zeroed at position 0. Every run is read through one :class:`Frame` (the clean
run's sink heads, the late layers: the last third of the blocks, the channel where it peaks from
the first block holding a set on), with 95% intervals over prompts of each figure and paired
intervals of the per-prompt differences (clean - zeroed, random - zeroed); below
:data:`~mechsink.interventions.stats.MIN_N_APART` prompts no set is called (too few prompts).
The block whose set carries the sink is the one whose zeroing lowers the late-layer sink score
most among the sets that lower it beyond the random baseline.
Super neurons: Yu et al. (2024), "The Super Weight in Large Language Models";
sink score: Gu et al. (2024), "When Attention Sink Emerges in Language Models".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.dose import Frame, RunSummary, make_frame, summarise
from mechsink.interventions.readout import Readout, measure_each
from mechsink.interventions.stats import MIN_N_APART, N_BOOT, TOO_FEW, Interval, paired_interval
from mechsink.interventions.targets import neuron_set
from mechsink.measure.sinks import DEFAULT_EPS
from mechsink.measure.super_neurons import SuperNeuronSet
from mechsink.model import true_d_mlp

MOVE_SHARE = 0.1  # a set moves the sink when zeroing it lowers it by at least this share

CRITERION = ("a set carries the sink if zeroing it at position 0 lowers the late-layer sink "
             "score below half its clean value, and the 95% intervals over prompts of "
             "clean - zeroed and of random - zeroed (a same-size random set of the same block) "
             "both exclude 0; it moves the sink if both intervals exclude 0 and the drop is at "
             f"least {MOVE_SHARE:.0%} of the clean value; else it does not carry the sink. The "
             "carrier is the block whose set lowers the late-layer sink score most among those "
             "that carry or move it. Intervals of the differences are paired over the same "
             f"prompts; with fewer than {MIN_N_APART} prompts no set is called")


@dataclass(frozen=True)
class SetCheck:
    """One set, zeroed and against its random twin: each run summarised through the frame, and
    the per-prompt differences of the late-layer sink score and of ``|channel|``."""

    layer: int
    channel: int
    units: tuple[int, ...]
    random_units: tuple[int, ...]
    zeroed: RunSummary
    random: RunSummary
    sink_drop: Interval | None  # clean - zeroed, late-layer sink score
    random_sink_drop: Interval | None  # clean - random
    beyond_random: Interval | None  # random - zeroed
    channel_drop: Interval | None  # |clean| - |zeroed| channel at the frame's layer
    random_channel_drop: Interval | None
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        def d(x: Interval | None) -> dict[str, Any] | None:
            return None if x is None else x.to_dict()

        z, r = self.zeroed, self.random
        return {"layer": self.layer, "channel": self.channel, "size": len(self.units),
                "neurons": list(self.units), "random_neurons": list(self.random_units),
                "zeroed": {"channel": d(z.channel), "late_sink_score": d(z.late_sink_score),
                           "sink_rate": d(z.sink_rate)},
                "random": {"channel": d(r.channel), "late_sink_score": d(r.late_sink_score),
                           "sink_rate": d(r.sink_rate)},
                "sink_drop": d(self.sink_drop), "random_sink_drop": d(self.random_sink_drop),
                "beyond_random": d(self.beyond_random), "channel_drop": d(self.channel_drop),
                "random_channel_drop": d(self.random_channel_drop), "verdict": self.verdict}


@dataclass(frozen=True)
class SetValidation:
    """Every set's check, the clean run's figures per channel and the carrier block."""

    frames: dict[int, Frame]  # per channel
    clean: dict[int, RunSummary]  # per channel
    checks: tuple[SetCheck, ...]
    carrier: int | None
    n_prompts: int

    def check(self, layer: int, channel: int | None = None) -> SetCheck:
        for c in self.checks:
            if c.layer == layer and (channel is None or c.channel == channel):
                return c
        raise KeyError(f"no set of block {layer} was validated")

    def carrier_check(self) -> SetCheck | None:
        return None if self.carrier is None else max(
            (c for c in self.checks if c.layer == self.carrier),
            key=_drop_mean)

    def to_dict(self) -> dict[str, Any]:
        def clean(s: RunSummary) -> dict[str, Any]:
            x = s.to_dict()
            return {k: x[k] for k in ("channel", "late_sink_score", "sink_rate")}

        return {"criterion": CRITERION, "n_prompts": self.n_prompts,
                "carrier_block": self.carrier,
                "frames": {str(ch): f.to_dict() for ch, f in self.frames.items()},
                "clean": {str(ch): clean(s) for ch, s in self.clean.items()},
                "sets": [c.to_dict() for c in self.checks]}


def late_layers(n_layers: int) -> tuple[int, ...]:
    """The last third of the blocks (at least one): one late-layer frame for every set, so the
    blocks' sets are compared on the same heads."""
    return tuple(range(n_layers - max(1, n_layers // 3), n_layers))


def random_units(d_mlp: int, size: int, exclude: Sequence[int], seed: int) -> tuple[int, ...]:
    """``size`` distinct neurons of a block of ``d_mlp``, none in ``exclude``, drawn from
    ``seed``."""
    pool = torch.tensor(sorted(set(range(d_mlp)) - {int(u) for u in exclude}))
    if len(pool) < size:
        raise BadInputError(f"a random baseline of {size} neurons needs {size} neurons outside "
                            f"the set; the block has {len(pool)}.")
    gen = torch.Generator().manual_seed(seed)
    return tuple(sorted(int(u) for u in pool[torch.randperm(len(pool), generator=gen)[:size]]))


def _only(r: Readout, index: int) -> Readout:
    return Readout(r.channels[..., index:index + 1], r.scores, r.loss)


def _late(r: Readout, frame: Frame) -> Tensor | None:
    heads = [(lay, h) for lay, h in frame.sink_heads if lay in frame.late_layers]
    if not heads:
        return None
    return torch.stack([r.scores[:, lay, h] for lay, h in heads], 1).double().mean(1)


def _diff(a: Tensor | None, b: Tensor | None, n_boot: int, seed: int) -> Interval | None:
    return None if a is None or b is None else paired_interval(a, b, n_boot=n_boot, seed=seed)


def _verdict(drop: Interval | None, beyond: Interval | None, clean: Interval | None,
             zeroed: Interval | None) -> str:
    if drop is None or beyond is None or clean is None or zeroed is None:
        return "not measured (no sink heads in the late layers)"
    if not (drop.callable and beyond.callable):
        return f"{TOO_FEW} (n={drop.n} < {MIN_N_APART})"
    if drop.low > 0 and beyond.low > 0:
        if zeroed.mean < 0.5 * clean.mean:
            return "carries the sink"
        if drop.mean >= MOVE_SHARE * clean.mean:
            return "moves the sink"
    return "does not carry the sink"


def _drop_mean(c: SetCheck) -> float:
    return c.sink_drop.mean if c.sink_drop is not None else float("-inf")


def validate_sets(
    model: Any, tokens: Int[Tensor, "batch pos"], sets: Sequence[SuperNeuronSet], *,
    eps: float = DEFAULT_EPS, seed: int = 0, n_boot: int = N_BOOT, batch_size: int = 8,
) -> SetValidation:
    """Zero each set (and a same-size random set of its block) at position 0 and read the
    channel and the sink against the clean run (see the module doc); 1 + 2 x len(sets)
    forwards of ``tokens``."""
    sets = [s for s in sets if s.units]
    if not sets:
        raise BadInputError("validate_sets needs at least one non-empty super-neuron set.")
    channels = sorted({s.channel for s in sets})
    d_mlp = int(true_d_mlp(model) or model.cfg.d_mlp)
    rands = [random_units(d_mlp, len(s.units), s.units, seed + s.layer) for s in sets]
    # the clean run and every set's two zeroings as stacked copies (batched forwards)
    edit_lists = [[]] + [neuron_set(model, s.layer, units).edits(0.0)
                         for s, rand in zip(sets, rands, strict=True)
                         for units in (s.units, rand)]
    clean, *zeroings = measure_each(model, tokens, edit_lists, channels=channels,
                                    batch_size=batch_size, loss=False)
    late = late_layers(int(model.cfg.n_layers))
    frames, cleans = {}, {}
    for i, ch in enumerate(channels):
        first = min(s.layer for s in sets if s.channel == ch)
        mag = clean.channels[..., i].abs().mean(0)
        peak = first + int(mag[first:].argmax())
        frames[ch] = make_frame(model, _only(clean, i), [], eps=eps, late_layers=late,
                                channel_layer=peak)
        cleans[ch] = summarise(_only(clean, i), frames[ch], n_boot=n_boot, seed=seed)
    checks = []
    for j, s in enumerate(sets):
        i, frame = channels.index(s.channel), frames[s.channel]
        rand = rands[j]
        runs = [_only(r, i) for r in zeroings[2 * j:2 * j + 2]]
        c0 = _only(clean, i)
        ly = frame.channel_layer
        mag = [r.channels[:, ly, 0].abs().double() for r in (c0, *runs)]
        late = [_late(r, frame) for r in (c0, *runs)]
        zeroed, random = (summarise(r, frame, n_boot=n_boot, seed=seed) for r in runs)
        drop = _diff(late[0], late[1], n_boot, seed)
        beyond = _diff(late[2], late[1], n_boot, seed)
        checks.append(SetCheck(
            s.layer, s.channel, tuple(s.units), rand, zeroed, random, drop,
            _diff(late[0], late[2], n_boot, seed), beyond,
            _diff(mag[0], mag[1], n_boot, seed), _diff(mag[0], mag[2], n_boot, seed),
            _verdict(drop, beyond, cleans[s.channel].late_sink_score, zeroed.late_sink_score)))
    moving = [c for c in checks if c.verdict in ("carries the sink", "moves the sink")]
    carrier = max(moving, key=_drop_mean).layer if moving else None
    return SetValidation(frames, cleans, tuple(checks), carrier, int(tokens.shape[0]))


# --- the census's field: which block's set carries the sink, on one of its runs ---------------

PREFERRED_RUNS = ("natural/bos", "natural/nobos", "natural/randfirst")
CENSUS_PROMPTS = 16  # the census validates on at most this many of the run's prompts (cost)


def census_validation(
    model: Any, runs: Sequence[Any], tokens: Sequence[Tensor], *, eps: float = DEFAULT_EPS,
    seed: int = 0, batch_size: int = 8,
) -> dict[str, Any]:
    """``census.json``'s ``super_neuron_causality``: :func:`validate_sets` of the named sets of
    one census run (natural text first, BOS first; ``runs`` and ``tokens`` in the same order),
    on that run's first :data:`CENSUS_PROMPTS` prompts; or ``{"not_applicable": why}``."""
    order = sorted(range(len(runs)), key=lambda i: (
        PREFERRED_RUNS.index(runs[i].name) if runs[i].name in PREFERRED_RUNS else 99, i))
    for i in order:
        found = runs[i].measurements.get("super_sets")
        sets = getattr(found, "sets", None)
        if sets is None:
            continue
        named = [s for s in sets() if s.units]
        if not named:
            continue
        out = validate_sets(model, tokens[i][:CENSUS_PROMPTS], named, eps=eps, seed=seed,
                            batch_size=batch_size).to_dict()
        return {"run": runs[i].name, **out}
    found = next((r.measurements.get("super_sets") for r in runs), None)
    why = (getattr(found, "reason", None) or
           "no run has a super-neuron set (no massive channel at position 0 that an MLP writes "
           "above the spike threshold)")
    return {"not_applicable": why}
