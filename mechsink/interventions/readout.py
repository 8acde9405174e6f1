"""Read the sinks and one residual channel off a single forward, with interventions in place.

The causal-chain experiments ask the same question many times: with these edits in place, how
much do later queries attend to key ``k``, and how large is channel ``c`` at position ``k``?
:func:`sink_readout` answers it from one cached forward. (Not a linear probe: nothing is fitted.)
:func:`massive_channel_sets` finds the massive channel at position 0 and the complete sets of
neurons that write it (the targets of :mod:`mechsink.interventions.chain`'s dose-responses).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.interventions.edits import Intervention, applied
from mechsink.measure import mlp_spikes, sink_scores
from mechsink.measure._cache import frame
from mechsink.measure.sinks import DEFAULT_EPS
from mechsink.measure.super_neurons import SuperNeuronSet
from mechsink.model import act_name, down_projection
from mechsink.names import deprecated, renamed_kwarg


class _MappingCompat:
    """``result["key"]`` of results that were dicts in earlier releases (deprecated)."""

    def __getitem__(self, key: str) -> Any:
        deprecated(f"{type(self).__name__}[{key!r}] (this result was a dict)",
                   f"the attribute .{key}")
        try:
            return getattr(self, key)
        except AttributeError:
            raise KeyError(key) from None

    def keys(self) -> list[str]:
        return list(self.__dataclass_fields__)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class SinkReadout:
    """Sink scores per key position (Gu's version unless ``include_self`` is False: queries
    after the key only), and one channel's values."""

    scores: dict[int, Float[Tensor, "layer head"]]  # mean over sequences
    rates: dict[int, float]  # fraction of (layer, head) above eps, per sequence, averaged
    channel: int | None
    channel_values: dict[int, Float[Tensor, " layer"]]  # resid_post[l, k, channel], mean
    include_self: bool = True

    def mean_score(self, position: int) -> float:
        return self.scores[position].mean().item()

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


@torch.no_grad()
def sink_readout(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    interventions: Sequence[Intervention] = (),
    *,
    positions: Sequence[int] | None = None,
    include_self: bool = True,
    channel: int | None = None,
    eps: float = DEFAULT_EPS,
    **old: Any,
) -> SinkReadout:
    """Run ``tokens`` once with ``interventions`` and measure the sinks at key ``positions``
    (default ``(0,)``): Gu's sink score, or with ``include_self=False`` the queries after the
    key only (the census's ``sink_score_no_self``). ``key_positions=`` is the old name of
    ``positions=``."""
    positions = renamed_kwarg(old, "key_positions", "positions", positions, "sink_readout")
    if old:
        raise TypeError(f"sink_readout() got unexpected arguments {sorted(old)}.")
    key_positions = (0,) if positions is None else tuple(positions)
    wanted = ("attn.hook_pattern", "hook_resid_post")
    with applied(model, list(interventions)):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(wanted))
    scores, rates, values = {}, {}, {}
    for k in key_positions:
        s = sink_scores(cache, position=k, eps=eps)
        scores[k], rates[k] = s.score(include_self), s.rate_of(include_self)
        if channel is not None:
            values[k] = torch.stack([cache[act_name("resid_post", layer)][:, k, channel]
                                     for layer in range(model.cfg.n_layers)], 1).mean(0).cpu()
    return SinkReadout(scores, rates, channel, values, include_self)


@dataclass(frozen=True)
class DominantSuperNeuron(_MappingCompat):
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
class MassiveChannelSets(_MappingCompat):
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
    _, cache = model.run_with_cache(tokens, names_filter=lambda h: h.endswith(
        ("mlp.hook_post", "hook_mlp_out", "hook_resid_post")))
    spikes = mlp_spikes(cache, down_projection(model))
    strength = (spikes.in_value.abs() * (spikes.in_pos == 0)).mean(0)  # per layer
    layer = int(strength.argmax())
    neuron = int(torch.mode(spikes.in_neuron[:, layer]).values)
    channel = int(torch.mode(spikes.out_channel[:, layer]).values)
    resid = torch.stack([cache[act_name("resid_post", lay)][:, 0]
                         for lay in range(model.cfg.n_layers)], 1)  # [batch, layer, d]
    return DominantSuperNeuron(
        layer, neuron, channel, spikes.in_value[:, layer].abs().mean().item(),
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
    from mechsink.measure.super_neurons import SET_HOOKS, _complete_set, super_neuron_sets

    n_layers = int(model.cfg.n_layers)
    names = [act_name(s, lay) for s in SET_HOOKS for lay in range(n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
    found = super_neuron_sets(cache, down_projection(model), coverage=coverage)
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
        by_layer[creating] = _complete_set(found.post0[:, creating],
                                           found.out0[:, creating, channel],
                                           found.w_out[creating, :, channel], coverage,
                                           creating, channel)
    sign = 1.0 if values[peak] >= 0 else -1.0
    builders = sorted(lay for lay, s in by_layer.items()
                      if lay <= peak and sign * s.write > 0)
    return MassiveChannelSets(
        channel, creating, peak, values,
        found.resid0.abs().median(-1).values.double().mean(0).tolist(),
        {lay: by_layer[lay] for lay in sorted(by_layer)}, builders or [creating],
        found.massive_channels())
