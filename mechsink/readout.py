"""Read the sinks and one residual channel off a single forward, with interventions in place.

The causal-chain experiments ask the same question many times: with these edits in place, how
much do later queries attend to key ``k``, and how large is channel ``c`` at position ``k``?
:func:`sink_readout` answers it from one cached forward. (Not a linear probe: nothing is fitted.)
:func:`massive_channel_sets` finds the massive channel at position 0 and the complete sets of
neurons that write it (the targets of :mod:`mechsink.chain`'s dose-responses).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.bridge import act_name, down_projection
from mechsink.interventions import Intervention, applied
from mechsink.measure import mlp_spikes, sink_scores
from mechsink.measure.sinks import DEFAULT_EPS


@dataclass(frozen=True)
class SinkReadout:
    """Sink scores (queries after the key) per key position, and one channel's values."""

    scores: dict[int, Float[Tensor, "layer head"]]  # mean over sequences
    rates: dict[int, float]  # fraction of (layer, head) above eps, per sequence, averaged
    channel: int | None
    channel_values: dict[int, Float[Tensor, " layer"]]  # resid_post[l, k, channel], mean

    def mean_score(self, key_pos: int) -> float:
        return self.scores[key_pos].mean().item()

    def to_dict(self) -> dict[str, Any]:
        return {"sink_score_mean": {k: self.mean_score(k) for k in self.scores},
                "sink_rate": dict(self.rates),
                "channel": self.channel,
                "channel_values": {k: v.tolist() for k, v in self.channel_values.items()}}


@torch.no_grad()
def sink_readout(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    interventions: Sequence[Intervention] = (),
    *,
    key_positions: Sequence[int] = (0,),
    channel: int | None = None,
    eps: float = DEFAULT_EPS,
) -> SinkReadout:
    """Run ``tokens`` once with ``interventions`` and measure the sinks at ``key_positions``."""
    wanted = ("attn.hook_pattern", "hook_resid_post")
    with applied(model, list(interventions)):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(wanted))
    scores, rates, values = {}, {}, {}
    for k in key_positions:
        s = sink_scores(cache, key_pos=k, eps=eps)
        scores[k], rates[k] = s.no_self.mean(0), s.rate_no_self
        if channel is not None:
            values[k] = torch.stack([cache[act_name("resid_post", layer)][:, k, channel]
                                     for layer in range(model.cfg.n_layers)], 1).mean(0).cpu()
    return SinkReadout(scores, rates, channel, values)


@torch.no_grad()
def dominant_super_neuron(model: Any, tokens: Int[Tensor, "batch pos"]) -> dict[str, Any]:
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
    return {"layer": layer, "neuron": neuron, "channel": channel,
            "input_at_pos0": spikes.in_value[:, layer].abs().mean().item(),
            "channel_at_pos0": resid[..., channel].mean(0).tolist(),
            "median_abs_at_pos0": resid.abs().median(-1).values.mean(0).tolist()}


@torch.no_grad()
def massive_channel_sets(
    model: Any, tokens: Int[Tensor, "batch pos"], *, coverage: float = 0.95,
) -> dict[str, Any]:
    """The massive channel at position 0 and the complete super-neuron sets that write it.

    The channel is the one with the largest mean ``|hook_resid_post|`` at position 0 over all
    blocks; ``creating_layer`` is the block whose output raises its magnitude most in one step;
    ``sets`` holds, for every block whose MLP writes the channel above the spike threshold at
    position 0, the fewest neurons explaining ``coverage`` of that write (Yu et al. 2024's
    detection made complete: :func:`mechsink.measure.super_neuron_sets`). ``builders`` are the
    blocks up to the peak whose write has the sign of the channel's peak value.
    """
    from mechsink.measure.super_neurons import (
        SET_HOOKS,
        SuperNeuronSet,
        _complete_set,
        super_neuron_sets,
    )

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
    return {"channel": channel, "creating_layer": creating, "peak_layer": peak,
            "channel_at_pos0": values,
            "median_abs_at_pos0": found.resid0.abs().median(-1).values.double().mean(0).tolist(),
            "sets": {lay: by_layer[lay] for lay in sorted(by_layer)},
            "builders": builders or [creating],
            "massive_channels": found.massive_channels()}
