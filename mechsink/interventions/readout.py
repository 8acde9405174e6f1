"""Run the model with interventions in place and read the sinks and channels: the one readout.

:func:`read_with_edits` installs declared edits (:func:`mechsink.interventions.edits.applied`)
around :func:`mechsink.measure.forward.measure_forward` (one forward per chunk, only the hooks
the measurements read). Two views of it answer the causal-chain experiments' questions:

- :func:`sink_readout`: with these edits, how much do later queries attend to key ``k``, and how
  large is channel ``c`` at position ``k``? (means over the sequences);
- :func:`measure`: per prompt, the tracked channels at position 0, Gu et al.'s sink score at key
  0 and the next-token loss (what :mod:`mechsink.interventions.dose` puts intervals on).

:func:`massive_channel_sets` finds the massive channel at position 0 and the complete sets of
neurons that write it (the targets of the dose-responses); :func:`dominant_super_neuron` the
strongest single super neuron. (Not a linear probe: nothing is fitted.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.edits import Intervention
from mechsink.interventions.stacked import read_each, read_with_edits
from mechsink.measure import mlp_spikes, sink_scores
from mechsink.measure.cache import frame
from mechsink.measure.checks import check_batch_size
from mechsink.measure.forward import Forward, Measurement, measure_forward, of_cache
from mechsink.measure.loss import NEXT_TOKEN_LOSS
from mechsink.measure.norms import RESID_HOOKS
from mechsink.measure.sinks import DEFAULT_EPS, check_eps, sink_score
from mechsink.measure.sinks import HOOKS as PATTERN_HOOKS
from mechsink.measure.super_neurons import HOOKS as SPIKE_HOOKS
from mechsink.measure.super_neurons import (
    SET_HOOKS,
    SuperNeuronSet,
    super_neuron_sets,
)
from mechsink.measure.wide import wide
from mechsink.model import act_name, down_projection, down_projection_bias, post_mlp_norms


def resid_at(n_layers: int, position: int, channels: int | list[int] | None = None
             ) -> Measurement:
    """``hook_resid_post[l, position, channels]`` of every block ``l``, stacked on axis 1:
    ``[batch, layer]`` for one channel, ``[batch, layer, channel]`` for a list or for all
    channels (None)."""
    pick = slice(None) if channels is None else channels

    def read(forward: Forward) -> Tensor:
        return torch.stack([forward.cache[act_name("resid_post", layer)][:, position, pick]
                            for layer in range(n_layers)], 1)

    return Measurement(RESID_HOOKS, read)


@dataclass(frozen=True)
class SinkReadout:
    """Sink scores per key position (Gu's version unless ``include_self`` is False: queries
    after the key only), and one channel's values."""

    scores: dict[int, Float[Tensor, "layer head"]]  # mean over sequences
    rates: dict[int, float]  # fraction of (layer, head) above eps, per sequence, averaged
    channel: int | None
    channel_values: dict[int, Float[Tensor, " layer"]]  # resid_post[l, k, channel], mean
    include_self: bool = True

    def score(self, position: int = 0) -> Float[Tensor, "layer head"]:
        """The sink score of key ``position`` per layer and head, averaged over sequences: the
        same reading as :meth:`mechsink.measure.SinkScores.score`."""
        if position not in self.scores:
            raise BadInputError(f"position {position} was not read; read positions: "
                                f"{sorted(self.scores)}.")
        return self.scores[position]

    def mean_score(self, position: int = 0) -> float:
        """:meth:`score` averaged over every layer and head: one number per position."""
        return self.score(position).mean().item()

    def to_dict(self) -> dict[str, Any]:
        return {"sink_score_mean": {k: self.mean_score(k) for k in self.scores},
                "sink_rate": dict(self.rates),
                "include_self": self.include_self,
                "channel": self.channel,
                "channel_values": {k: v.tolist() for k, v in self.channel_values.items()}}

    def to_frame(self) -> Any:
        """One row per (key position, layer, head): the sink score (and the channel's value at
        that position and layer when a channel was read)."""
        rows: dict[str, list[Any]] = {"position": [], "layer": [], "head": [], "sink_score": []}
        if self.channel is not None:
            rows["channel_value"] = []
        for k, sc in self.scores.items():
            n_layers, n_heads = sc.shape
            for layer in range(n_layers):
                for h in range(n_heads):
                    rows["position"].append(k)
                    rows["layer"].append(layer)
                    rows["head"].append(h)
                    rows["sink_score"].append(float(sc[layer, h]))
                    if self.channel is not None:
                        rows["channel_value"].append(float(self.channel_values[k][layer]))
        return frame(rows)


def sink_readout(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    interventions: Sequence[Intervention] = (),
    *,
    positions: Sequence[int] | None = None,
    include_self: bool = True,
    channel: int | None = None,
    eps: float = DEFAULT_EPS,
) -> SinkReadout:
    """Run ``tokens`` once with ``interventions`` and measure the sinks at key ``positions``
    (default ``(0,)``): Gu's sink score, or with ``include_self=False`` the queries after the
    key only (the census's ``sink_score_no_self``); and ``channel`` at each of them."""
    keys, wanted = _sink_wanted(model, tokens, positions, channel, eps)
    got = read_with_edits(model, tokens, wanted, interventions)
    return _as_sink_readout(got, keys, include_self, channel)


def sink_readout_each(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    edit_lists: Sequence[Sequence[Intervention]],
    *,
    positions: Sequence[int] | None = None,
    include_self: bool = True,
    channel: int | None = None,
    eps: float = DEFAULT_EPS,
) -> list[SinkReadout]:
    """:func:`sink_readout` under each of ``edit_lists``, as batched forwards over stacked
    copies of ``tokens`` (:func:`mechsink.interventions.stacked.read_each`)."""

    keys, wanted = _sink_wanted(model, tokens, positions, channel, eps)
    return [_as_sink_readout(got, keys, include_self, channel)
            for got in read_each(model, tokens, wanted, edit_lists)]


def _sink_wanted(model: Any, tokens: Tensor, positions: Sequence[int] | None,
                 channel: int | None, eps: float) -> tuple[tuple[int, ...],
                                                           dict[str, Measurement]]:
    """The key positions and what :func:`sink_readout` reads, checked before any work."""
    key_positions = (0,) if positions is None else tuple(int(k) for k in positions)
    check_eps(eps)
    n_pos, n_layers = int(tokens.shape[-1]), int(model.cfg.n_layers)
    for k in key_positions:
        if not 0 <= k < n_pos:
            raise BadInputError(f"position={k} is outside the sequence (length {n_pos}).")
    wanted: dict[str, Measurement] = {}
    for k in key_positions:
        wanted[f"sinks@{k}"] = of_cache(PATTERN_HOOKS,
                                        lambda cache, k=k: sink_scores(cache, k, eps))
        if channel is not None:
            wanted[f"channel@{k}"] = resid_at(n_layers, k, channel)
    return key_positions, wanted


def _as_sink_readout(got: dict[str, Any], keys: tuple[int, ...], include_self: bool,
                     channel: int | None) -> SinkReadout:
    scores, rates, values = {}, {}, {}
    for k in keys:
        s = got[f"sinks@{k}"]
        scores[k], rates[k] = s.score(include_self), s.rate_of(include_self)
        if channel is not None:
            values[k] = wide(got[f"channel@{k}"]).mean(0).cpu()
    return SinkReadout(scores, rates, channel, values, include_self)


# --- one measured run, per prompt (what the dose-responses read) ---------------------------------


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


def _key0_scores(n_layers: int) -> Measurement:
    """Gu's sink score at key 0 per sequence, layer and head, ``[batch, layer, head]``."""

    def read(forward: Forward) -> Tensor:
        return torch.stack([sink_score(forward.cache[act_name("pattern", layer)].float(), 0)
                            for layer in range(n_layers)], 1).cpu()

    return Measurement(PATTERN_HOOKS, read)


def measure(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    edits: Sequence[Intervention] = (),
    *,
    channels: Sequence[int] = (),
    batch_size: int = 8,
    loss: bool = True,
) -> Readout:
    """Run ``tokens`` with ``edits`` in place (removed afterwards), ``batch_size`` sequences per
    forward, and read the channels at position 0, the sink scores at key 0 and the next-token
    loss, per prompt (``loss=False``: no unembedding, the loss is NaN)."""
    wanted = _readout_measurements(model, tokens, channels, batch_size, loss)
    got = read_with_edits(model, tokens, wanted, edits, batch_size=batch_size)
    return _as_readout(model, tokens, got, bool(channels), loss)


def measure_each(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    edit_lists: Sequence[Sequence[Intervention]],
    *,
    channels: Sequence[int] = (),
    batch_size: int = 8,
    loss: bool = True,
) -> list[Readout]:
    """:func:`measure` under each of ``edit_lists``, as batched forwards over stacked copies of
    ``tokens`` (:func:`mechsink.interventions.stacked.read_each`): the same readouts, fewer
    and larger forwards."""

    wanted = _readout_measurements(model, tokens, channels, batch_size, loss)
    return [_as_readout(model, tokens, got, bool(channels), loss)
            for got in read_each(model, tokens, wanted, edit_lists, batch_size=batch_size)]


def _readout_measurements(model: Any, tokens: Tensor, channels: Sequence[int],
                          batch_size: int | None, loss: bool) -> dict[str, Measurement]:
    """What :func:`measure` reads, checked before any work."""
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise BadInputError("tokens must be [batch, pos] with at least two positions.")
    if batch_size is None:
        raise BadInputError("batch_size must be a positive integer, got None.")
    check_batch_size(batch_size)
    chans = [int(c) for c in channels]
    n_layers = int(model.cfg.n_layers)
    wanted = {"scores": _key0_scores(n_layers)}
    if loss:
        wanted["loss"] = NEXT_TOKEN_LOSS
    if chans:
        channels_at_0 = resid_at(n_layers, 0, chans)
        wanted["channels"] = Measurement(
            channels_at_0.hooks, lambda forward: channels_at_0.read(forward).float().cpu())
    return wanted


def _as_readout(model: Any, tokens: Tensor, got: dict[str, Any], chans: bool, loss: bool
                ) -> Readout:
    n_layers = int(model.cfg.n_layers)
    ch = got["channels"] if chans else torch.zeros(tokens.shape[0], n_layers, 0)
    nan = torch.full((tokens.shape[0],), float("nan"))
    return Readout(ch, got["scores"], got["loss"] if loss else nan)


# --- the targets: the massive channel and the neurons that write it ----------------------------


@dataclass(frozen=True)
class DominantSuperNeuron:
    """The strongest super neuron at position 0 and the channel it writes (see
    :func:`dominant_super_neuron`); per-layer lists are means over sequences."""

    layer: int
    neuron: int
    channel: int
    input_at_pos0: float  # mean |down-projection input| of the layer's largest neuron
    channel_at_pos0: list[float]  # hook_resid_post[l, 0, channel] per layer
    median_abs_at_pos0: list[float]  # median |hook_resid_post[l, 0, :]| per layer

    @property
    def name(self) -> str:
        """The neuron in the short form of :mod:`mechsink.names` (``L3N1229``)."""
        return f"L{self.layer}N{self.neuron}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_frame(self) -> Any:
        """One row per layer: the channel's value and the median magnitude at position 0."""
        n = len(self.channel_at_pos0)
        return frame({"layer": range(n), "channel_at_pos0": self.channel_at_pos0,
                      "median_abs_at_pos0": self.median_abs_at_pos0})


@dataclass(frozen=True)
class MassiveChannelSets:
    """The massive channel at position 0 and the complete super-neuron sets that write it
    (see :func:`massive_channel_sets`)."""

    channel: int
    creating_layer: int
    peak_layer: int
    channel_at_pos0: list[float]
    median_abs_at_pos0: list[float]
    sets: dict[int, SuperNeuronSet] = field(default_factory=dict)
    builders: list[int] = field(default_factory=list)
    massive_channels: list[int] = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"MassiveChannelSets(channel={self.channel}, creating_layer="
                f"{self.creating_layer}, peak_layer={self.peak_layer}, sets={len(self.sets)} "
                f"(layers {sorted(self.sets)}), builders={self.builders})")

    def _repr_html_(self) -> str:
        """A card for Jupyter: the channel and one row per complete set."""
        from html import escape

        table = self.to_frame().to_html(index=False, float_format="%.4g")
        return f"<div><b>{escape(repr(self))}</b>{table}</div>"

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["sets"] = {lay: s.to_dict() for lay, s in self.sets.items()}
        return out

    def to_frame(self) -> Any:
        """One row per block whose MLP writes the channel: its complete set."""
        sets = list(self.sets.values())
        return frame({"layer": [s.layer for s in sets], "write": [s.write for s in sets],
                      "size": [len(s.neurons) for s in sets],
                      "neurons": [[n for n, _ in s.neurons] for s in sets],
                      "explained": [s.explained for s in sets],
                      "builder": [s.layer in self.builders for s in sets]})


@torch.no_grad()
def dominant_super_neuron(model: Any, tokens: Int[Tensor, "batch pos"]) -> DominantSuperNeuron:
    """The layer whose largest down-projection input at position 0 is biggest, that neuron,
    the channel its layer writes most, and the channel's value at position 0 in every layer."""
    n_layers, w_out = int(model.cfg.n_layers), down_projection(model)
    got = measure_forward(model, tokens, {
        "spikes": of_cache(SPIKE_HOOKS, lambda cache: mlp_spikes(cache, w_out)),
        "resid": resid_at(n_layers, 0)})
    spikes, resid = got["spikes"], wide(got["resid"])  # resid: [batch, layer, d_model]
    strength = (wide(spikes.in_value).abs() * (spikes.in_pos == 0)).mean(0)  # per layer
    layer = int(strength.argmax())
    neuron = int(torch.mode(spikes.in_neuron[:, layer]).values)
    channel = int(torch.mode(spikes.out_channel[:, layer]).values)
    return DominantSuperNeuron(
        layer, neuron, channel, wide(spikes.in_value[:, layer]).abs().mean().item(),
        resid[..., channel].mean(0).tolist(), resid.abs().median(-1).values.mean(0).tolist())


@torch.no_grad()
def massive_channel_sets(
    model: Any, tokens: Int[Tensor, "batch pos"], *, coverage: float = 0.95,
) -> MassiveChannelSets:
    """The massive channel at position 0 and the complete super-neuron sets that write it.

    The channel is the one with the largest mean ``|hook_resid_post|`` at position 0 over all
    blocks; ``creating_layer`` is the block whose output raises its magnitude most in one step;
    ``sets`` holds, for every block whose MLP writes the channel above the spike threshold at
    position 0, the fewest neurons explaining ``coverage`` of that write (Yu et al. 2024's
    detection made complete: :func:`mechsink.measure.super_neuron_sets`). ``builders`` are the
    blocks up to the peak whose write has the sign of the channel's peak value.
    """
    n_layers, w_out = int(model.cfg.n_layers), down_projection(model)
    norms, b_out = post_mlp_norms(model), down_projection_bias(model)
    found = measure_forward(model, tokens, {"sets": of_cache(
        SET_HOOKS, lambda cache: super_neuron_sets(cache, w_out, coverage=coverage,
                                                   post_norms=norms, b_out=b_out))})["sets"]
    resid0 = found.resid0.double().mean(0)  # [layer, d_model]
    channel = int(resid0.abs().amax(0).argmax())
    values = resid0[:, channel].tolist()
    mag = [abs(v) for v in values]
    steps = [mag[lay] - (mag[lay - 1] if lay else 0.0) for lay in range(n_layers)]
    creating = max(range(n_layers), key=steps.__getitem__)
    peak = max(range(n_layers), key=mag.__getitem__)
    by_layer: dict[int, SuperNeuronSet] = {s.layer: s for s in found.sets()
                                           if s.channel == channel}
    if creating not in by_layer:  # a write under the spike threshold: still give its set
        by_layer[creating] = found.set_of(creating, channel)
    sign = 1.0 if values[peak] >= 0 else -1.0
    builders = sorted(lay for lay, s in by_layer.items()
                      if lay <= peak and sign * s.write > 0)
    return MassiveChannelSets(
        channel, creating, peak, values,
        found.resid0.abs().median(-1).values.double().mean(0).tolist(),
        {lay: by_layer[lay] for lay in sorted(by_layer)}, builders or [creating],
        found.massive_channels())
