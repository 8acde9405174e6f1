"""Super neurons per expert, and the router's choice at position 0, in a mixture-of-experts MLP.

A mixture-of-experts block has no one down projection: each routed expert ``e`` has its own, and
its input ``act(gate_e x) * up_e x`` (:class:`mechsink.model.moe.Experts`) is where an expert's
super neurons live (Yu et al. 2024, "The Super Weight in Large Language Models", per expert). For
every block and expert we take, over the positions the router sent to that expert, the largest
``|input|`` (which neuron, where); a super neuron is such an input above the spike threshold (50)
at a position where the block's output (``hook_mlp_out``) also spikes, with the channel its
routed write ``weight x input x down_e[channel, neuron]`` reaches most. The router's choice at
position 0 (experts and weights, per block) is read from TransformerLens's MoE hooks. Pure: the
cache and the experts' weights only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.cache import CacheLike, rounded
from mechsink.model.moe import Experts

HOOKS = ("mlp.hook_in", "mlp.hook_expert_indices", "mlp.hook_expert_weights", "hook_mlp_out")
SPIKE_THRESHOLD = 50.0


@dataclass(frozen=True)
class ExpertSpikes:
    """Per sequence, block and expert: the largest routed down-projection input (NaN where the
    expert got no token), its neuron and position; the router's top-k at position 0; and every
    spike ``(layer, expert, neuron, channel, position, activation, contribution)``."""

    threshold: float
    max_abs: Float[Tensor, "batch layer expert"]
    neuron: Int[Tensor, "batch layer expert"]
    position: Int[Tensor, "batch layer expert"]
    router_experts: Int[Tensor, "batch layer k"]  # at position 0
    router_weights: Float[Tensor, "batch layer k"]
    spikes: tuple[tuple[int, int, int, int, int, float, float], ...]
    shared: tuple[bool, ...]  # per block: a shared expert the measurement leaves out

    @classmethod
    def merge(cls, parts: Sequence[ExpertSpikes]) -> ExpertSpikes:
        cat = [torch.cat([getattr(p, f) for p in parts]) for f in
               ("max_abs", "neuron", "position", "router_experts", "router_weights")]
        return cls(parts[0].threshold, *cat, tuple(s for p in parts for s in p.spikes),
                   parts[0].shared)

    def router_at_position_0(self) -> list[dict[str, Any]]:
        """Per block: each expert chosen at position 0, how many sequences chose it and its
        mean weight there (experts by count, then weight)."""
        out = []
        n = self.router_experts.shape[0]
        for layer in range(self.router_experts.shape[1]):
            count: Counter[int] = Counter()
            weight: dict[int, float] = {}
            for b in range(n):
                for e, w in zip(self.router_experts[b, layer].tolist(),
                                self.router_weights[b, layer].tolist(), strict=True):
                    count[e] += 1
                    weight[e] = weight.get(e, 0.0) + w
            rows = sorted(count, key=lambda e: (-count[e], -weight[e]))
            out.append({"layer": layer, "experts": [
                {"expert": e, "sequences": count[e], "mean_weight": rounded(weight[e] / count[e])}
                for e in rows]})
        return out

    def super_neurons(self) -> list[dict[str, Any]]:
        """Spikes grouped by (layer, expert, neuron, channel): mean activation and contribution,
        the most frequent position and the number of spikes."""
        groups: dict[tuple[int, int, int, int], list[tuple[int, float, float]]] = {}
        for layer, expert, neuron, channel, pos, act, contrib in self.spikes:
            groups.setdefault((layer, expert, neuron, channel), []).append((pos, act, contrib))
        out = []
        for (layer, expert, neuron, channel), rows in sorted(groups.items()):
            pos = Counter(r[0] for r in rows).most_common(1)[0][0]
            out.append({"layer": layer, "expert": expert, "neuron": neuron, "channel": channel,
                        "position": pos, "activation": rounded(sum(r[1] for r in rows) / len(rows)),
                        "contribution": rounded(sum(r[2] for r in rows) / len(rows)),
                        "count": len(rows)})
        return out

    def to_dict(self) -> dict[str, Any]:
        mean = torch.nanmean(self.max_abs.double(), 0)  # [layer, expert]
        routed = (~torch.isnan(self.max_abs)).double().mean(0)
        return {"experts": {
            "criterion": {"spike_threshold": self.threshold, "input": "each routed expert's "
                          "down-projection input act(gate_e x) * up_e x, at the positions the "
                          "router sent to it", "output_hook": HOOKS[3],
                          "router_hooks": list(HOOKS[1:3]),
                          "shared_expert_blocks": [i for i, s in enumerate(self.shared) if s]},
            "router_at_position_0": self.router_at_position_0(),
            "max_abs_input": [[rounded(v) for v in row] for row in mean.tolist()],
            "routed_share": [[rounded(v) for v in row] for row in routed.tolist()],
            "super_neurons": self.super_neurons()}}


def _block(
    x: Float[Tensor, "batch pos d_model"], out: Float[Tensor, "batch pos d_model"],
    idx: Int[Tensor, "token k"], wts: Float[Tensor, "token expert"], experts: Experts,
    layer: int, threshold: float,
) -> tuple[Tensor, Tensor, Tensor, list[tuple[int, int, int, int, int, float, float]]]:
    """One block: per sequence and expert the largest routed input, and the spikes."""
    batch, n_pos, d = x.shape
    flat = x.reshape(-1, d).float()
    out_spiking = (out.abs() > threshold).reshape(batch * n_pos, -1)
    n_exp = experts.n_experts
    max_abs = torch.full((batch, n_exp), float("nan"))
    neuron = torch.zeros(batch, n_exp, dtype=torch.long)
    position = torch.zeros(batch, n_exp, dtype=torch.long)
    spikes = []
    for e in range(n_exp):
        tokens = torch.nonzero((idx == e).any(-1))[:, 0]
        if not len(tokens):
            continue
        h = experts.hidden(flat[tokens], e).float()  # [routed, d_expert]
        best = h.abs().argmax(-1)
        val = h.abs().gather(-1, best[:, None])[:, 0]
        for t, v, n in zip(tokens.tolist(), val.tolist(), best.tolist(), strict=True):
            b, p = divmod(t, n_pos)
            if torch.isnan(max_abs[b, e]) or v > max_abs[b, e]:
                max_abs[b, e], neuron[b, e], position[b, e] = v, n, p
        down = experts.down[e].float()  # [d_model, d_expert]
        for row, t in enumerate(tokens.tolist()):
            chans = torch.nonzero(out_spiking[t])[:, 0]
            if not len(chans):
                continue
            for n in torch.nonzero(h[row].abs() > threshold)[:, 0].tolist():
                act = float(h[row, n])
                contrib = float(wts[t, e]) * act * down[chans, n]
                c = int(contrib.abs().argmax())
                spikes.append((layer, e, n, int(chans[c]), t % n_pos, act, float(contrib[c])))
    return max_abs, neuron, position, spikes


def _check_shapes(layer: int, x: Tensor, idx: Tensor, wts: Tensor, ex: Experts) -> None:
    """The MoE hooks as this measurement reads them, or a BadInputError saying what differs
    (the census then reports the measurement as not applicable)."""
    tokens = int(x.shape[0] * x.shape[1]) if x.ndim == 3 else -1
    want = {"mlp.hook_in": (x.ndim == 3 and x.shape[2] == ex.gate.shape[2]),
            "mlp.hook_expert_indices": idx.numel() == tokens * ex.top_k,
            "mlp.hook_expert_weights": wts.numel() == tokens * ex.n_experts}
    bad = [k for k, ok in want.items() if not ok]
    if bad:
        raise BadInputError(
            f"block {layer}: {', '.join(bad)} do not have the shapes the per-expert measurement "
            f"reads ([batch, pos, d_model]; [token, top_k={ex.top_k}]; [token, "
            f"experts={ex.n_experts}]): got {tuple(x.shape)}, {tuple(idx.shape)}, "
            f"{tuple(wts.shape)}")


def expert_spikes(
    cache: CacheLike, experts: Sequence[Experts], threshold: float = SPIKE_THRESHOLD,
) -> ExpertSpikes:
    """Super neurons per expert and the router's choice at position 0 (see the module doc)."""
    parts, spikes, router_e, router_w = [], [], [], []
    for layer, ex in enumerate(experts):
        x = cache[f"blocks.{layer}.{HOOKS[0]}"]
        idx = cache[f"blocks.{layer}.{HOOKS[1]}"].long()
        wts = cache[f"blocks.{layer}.{HOOKS[2]}"].float()  # [token, expert], 0 where unrouted
        out = cache[f"blocks.{layer}.{HOOKS[3]}"]
        batch, n_pos = x.shape[:2]
        _check_shapes(layer, x, idx, wts, ex)
        m, n, p, s = _block(x, out, idx.reshape(batch * n_pos, -1),
                            wts.reshape(batch * n_pos, -1), ex, layer, threshold)
        parts.append((m, n, p))
        spikes += s
        first = idx.reshape(batch, n_pos, -1)[:, 0].cpu()  # [batch, k]
        router_e.append(first)
        router_w.append(wts.reshape(batch, n_pos, -1)[:, 0].cpu().gather(-1, first))
    stack = [torch.stack([q[i] for q in parts], 1) for i in range(3)]
    return ExpertSpikes(float(threshold), *stack, torch.stack(router_e, 1),
                        torch.stack(router_w, 1), tuple(spikes), tuple(e.shared for e in experts))


@dataclass(frozen=True)
class NoExperts:
    """A dense model: nothing to report (its super neurons are ``mlp`` and ``super_sets``)."""

    @classmethod
    def merge(cls, parts: Sequence[NoExperts]) -> NoExperts:
        return parts[0]

    def to_dict(self) -> dict[str, Any]:
        return {}
