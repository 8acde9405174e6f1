"""Super neurons and super weights (Yu et al. 2024, "The Super Weight in Large Language Models").

Per layer and sequence we take the largest ``|input|`` of the MLP down projection
(``mlp.hook_post``: which neuron, at which position) and the largest ``|output|``
(``hook_mlp_out``: which channel, where). A layer whose input and output both exceed the spike
threshold (50) at the same position holds a super neuron; the super weight
``W_out[neuron, channel]`` joins the input spike to the output spike, and
``activation * W_out[neuron, channel]`` is what that one weight writes into the spiking channel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.measure._cache import CacheLike, rounded, rounded_list, stacked

HOOKS = ("mlp.hook_post", "hook_mlp_out")
SPIKE_THRESHOLD = 50.0


def _argmax_abs(
    x: Float[Tensor, "layer batch pos width"],
) -> tuple[Float[Tensor, "batch layer"], Int[Tensor, "batch layer"], Int[Tensor, "batch layer"]]:
    """Signed value, index along ``width`` and position of the largest ``|x|`` per layer and
    sequence."""
    width = x.shape[3]
    flat = x.flatten(2)
    best = flat.abs().argmax(dim=-1)
    value = flat.gather(-1, best[..., None])[..., 0]
    return value.transpose(0, 1), (best % width).transpose(0, 1), (best // width).transpose(0, 1)


@dataclass(frozen=True)
class SuperNeuron:
    """A down-projection neuron whose input spike writes an output spike into ``channel``.

    ``activation``: mean signed input of the neuron; ``contribution``: mean of
    ``activation * W_out[neuron, channel]``; ``output``: mean value of the MLP output in that
    channel; all over the ``count`` sequences in which the layer spiked this way.
    """

    layer: int
    neuron: int
    channel: int
    position: int
    activation: float
    contribution: float
    output: float
    weight: float
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "neuron": self.neuron, "channel": self.channel,
                "position": self.position, "activation": rounded(self.activation),
                "contribution": rounded(self.contribution), "output": rounded(self.output),
                "weight": rounded(self.weight), "count": self.count}


@dataclass(frozen=True)
class MlpSpikes:
    """Per sequence and layer: the largest down-projection input and MLP output, where they are,
    and what the weight joining them contributes."""

    threshold: float
    in_value: Float[Tensor, "batch layer"]
    in_neuron: Int[Tensor, "batch layer"]
    in_pos: Int[Tensor, "batch layer"]
    out_value: Float[Tensor, "batch layer"]
    out_channel: Int[Tensor, "batch layer"]
    out_pos: Int[Tensor, "batch layer"]
    weight: Float[Tensor, "batch layer"]  # W_out[l, in_neuron, out_channel]

    @classmethod
    def merge(cls, parts: Sequence[MlpSpikes]) -> MlpSpikes:
        fields = ("in_value", "in_neuron", "in_pos", "out_value", "out_channel", "out_pos",
                  "weight")
        return cls(parts[0].threshold,
                   *(torch.cat([getattr(p, f) for p in parts]) for f in fields))

    def super_neurons(self) -> list[SuperNeuron]:
        """Layers whose input and output both spike at the same position, grouped by
        (layer, neuron, channel); ``position`` is the most frequent spike position."""
        spiking = ((self.in_value.abs() > self.threshold)
                   & (self.out_value.abs() > self.threshold) & (self.in_pos == self.out_pos))
        groups: dict[tuple[int, int, int], list[int]] = {}
        for b, layer in torch.nonzero(spiking).tolist():
            key = (layer, int(self.in_neuron[b, layer]), int(self.out_channel[b, layer]))
            groups.setdefault(key, []).append(b)
        out = []
        for (layer, neuron, channel), bs in sorted(groups.items()):
            act = self.in_value[bs, layer].double()
            w = self.weight[bs, layer].double()
            pos = torch.mode(self.in_pos[bs, layer]).values
            out.append(SuperNeuron(layer, neuron, channel, int(pos), float(act.mean()),
                                   float((act * w).mean()),
                                   float(self.out_value[bs, layer].double().mean()),
                                   float(w.mean()), len(bs)))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "criterion": {"spike_threshold": self.threshold, "input_hook": HOOKS[0],
                          "output_hook": HOOKS[1]},
            "super_neurons": [s.to_dict() for s in self.super_neurons()],
            "mlp_spikes": {
                "max_abs_input": rounded_list(self.in_value.abs().double().mean(0)),
                "max_abs_output": rounded_list(self.out_value.abs().double().mean(0)),
            },
        }


def mlp_spikes(
    cache: CacheLike,
    w_out: Float[Tensor, "layer d_mlp d_model"],
    threshold: float = SPIKE_THRESHOLD,
) -> MlpSpikes:
    """Yu et al.'s per-layer spikes from ``mlp.hook_post`` and ``hook_mlp_out``; ``w_out`` is
    the stacked down projection (``post @ W_out[l] (+ b_out) = mlp_out``)."""
    post = stacked(cache, HOOKS[0]).float()
    out = stacked(cache, HOOKS[1]).float()
    in_value, in_neuron, in_pos = _argmax_abs(post)
    out_value, out_channel, out_pos = _argmax_abs(out)
    w = w_out.detach().to(post.device, torch.float32)
    layers = torch.arange(w.shape[0], device=post.device)[None, :].expand_as(in_neuron)
    weight = w[layers, in_neuron, out_channel]
    return MlpSpikes(float(threshold), in_value.cpu(), in_neuron.cpu(), in_pos.cpu(),
                     out_value.cpu(), out_channel.cpu(), out_pos.cpu(), weight.cpu())
