"""Super neurons and super weights (Yu et al. 2024, "The Super Weight in Large Language Models").

Per layer and sequence we take the largest ``|input|`` of the MLP down projection
(``mlp.hook_post``: which neuron, at which position) and the largest ``|output|``
(``hook_mlp_out``: which channel, where). A layer whose input and output both exceed the spike
threshold (50) at the same position holds a super neuron; the super weight
``W_out[neuron, channel]`` joins the input spike to the output spike, and
``activation * W_out[neuron, channel]`` is what that one weight writes into the spiking channel.

Yu et al.'s detection is iterative (remove the largest spike, detect again), so a layer can hold
several super neurons. :func:`super_neuron_sets` lists every neuron that meets the criterion and,
per layer and spiking channel at position 0, the *complete set*: the fewest neurons, ranked by
contribution, whose writes explain at least 95% of the MLP's write into that channel. An
intervention on one neuron of a several-neuron set leaves the channel standing.

The write is what reaches the residual stream: where a block normalises its MLP's output before
the residual add (Gemma 2/3, OLMo 2: ``hook_mlp_out = norm(post @ W_out)``), a neuron's share of
the down projection's output says nothing about the residual write (the norm divides by the RMS
of the whole output, so zeroing the neuron that explains 0.99 of a 0.07 down-projection write can
leave the ~2e5 residual write standing). There the set is found by zeroing: the fewest neurons,
added greedily, whose zeroing (run through the model's own norm module) removes ``coverage`` of
the residual write; without a norm that is exactly the ranked-share set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.measure.cache import CacheLike, frame, grid_frame, rounded, rounded_list, stacked

HOOKS = ("mlp.hook_post", "hook_mlp_out")
SPIKE_THRESHOLD = 50.0
PostNorm = Callable[[Tensor], Tensor]  # a post-MLP norm: [..., d_model] -> [..., d_model]


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

    def to_frame(self) -> Any:
        """One row per layer: mean max |down-projection input| and |MLP output|."""
        return grid_frame(("layer",), {"max_abs_input": self.in_value.abs().double().mean(0),
                                       "max_abs_output": self.out_value.abs().double().mean(0)})

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
    # only the entries read are converted: a float32 copy of every down projection is 7.5 GB
    # on an 8B model in bfloat16 (w_out is the blocks' own tensors, a LayerStack)
    w = w_out.detach()
    layers = torch.arange(w.shape[0], device=post.device)[None, :].expand_as(in_neuron)
    weight = w[layers, in_neuron, out_channel].to(post.device, torch.float32)
    return MlpSpikes(float(threshold), in_value.cpu(), in_neuron.cpu(), in_pos.cpu(),
                     out_value.cpu(), out_channel.cpu(), out_pos.cpu(), weight.cpu())


# --- complete sets: every spiking neuron, and the neurons that make up a channel's write -------

COVERAGE = 0.95  # a complete set explains at least this share of the MLP's write at position 0
SET_HOOKS = (*HOOKS, "hook_resid_post")
MASSIVE_ABS, MASSIVE_RATIO = 100.0, 1000.0  # Sun et al. 2024's massive-activation rule


@dataclass(frozen=True)
class SpikingNeuron:
    """One down-projection input spike ``|post| > threshold`` at a position where the MLP output
    also spikes, with the spiking channel it writes most (``contribution = activation x
    W_out[neuron, channel]``). ``count`` is the number of its spikes, (sequence, position)
    pairs (a neuron spiking at two positions of one sequence counts twice); ``activation`` and
    ``contribution`` are means over them, and ``position`` is where it spiked most often."""

    layer: int
    neuron: int
    channel: int
    position: int
    activation: float
    contribution: float
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "neuron": self.neuron, "channel": self.channel,
                "position": self.position, "activation": rounded(self.activation),
                "contribution": rounded(self.contribution), "count": self.count}


@dataclass(frozen=True)
class SuperNeuronSet:
    """The ranked neurons whose position-0 writes into ``channel`` together explain at least
    ``coverage`` of MLP ``layer``'s write there, as it reaches the residual stream (means over
    sequences).

    ``write``: mean ``hook_mlp_out[layer, 0, channel]`` (what reaches the residual stream, after
    any post-MLP norm); ``down_write``: mean ``sum_n post_n W_out[n, channel]`` (the down
    projection's output, no bias, before any post-MLP norm); ``neurons``: ``(neuron, mean
    contribution)`` best first, in the units of ``basis``; ``explained``: the share of the
    neurons' write that zeroing the set removes (no post-MLP norm: the sum of the set's
    contributions over ``down_write``); ``explained_min``: the smallest per-sequence share;
    ``complete``: whether ``explained`` reached ``coverage``. ``basis`` says what the shares are
    of; with a post-MLP norm, ``neuron_write`` is the residual write of every neuron together
    (``norm(y)_c - norm(b_out)_c``) and ``down_units`` the set the raw down-projection shares
    would have named (for comparison: it is not what the residual stream receives).
    """

    layer: int
    channel: int
    write: float
    down_write: float
    neurons: tuple[tuple[int, float], ...]
    explained: float
    explained_min: float
    coverage: float
    complete: bool
    basis: str = "down projection output (no post-MLP norm: what reaches the residual stream)"
    neuron_write: float | None = None
    down_units: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        shown = ", ".join(str(n) for n, _ in self.neurons[:5])
        more = ", ..." if len(self.neurons) > 5 else ""
        return (f"SuperNeuronSet(layer={self.layer}, channel={self.channel}, "
                f"{len(self.neurons)} neurons [{shown}{more}], explained={self.explained:.3f}, "
                f"write={self.write:.4g}, complete={self.complete})")

    @property
    def units(self) -> list[int]:
        return [n for n, _ in self.neurons]

    @property
    def normed(self) -> bool:
        """Whether the block normalises its MLP output before the residual add."""
        return self.neuron_write is not None

    def to_dict(self) -> dict[str, Any]:
        total = self.neuron_write if self.normed else self.down_write
        out = {"layer": self.layer, "channel": self.channel, "write": rounded(self.write),
               "down_write": rounded(self.down_write), "basis": self.basis,
               "neurons": [{"neuron": n, "contribution": rounded(c),
                            "share": rounded(c / total if total else float("nan"))}
                           for n, c in self.neurons],
               "size": len(self.neurons), "explained": rounded(self.explained),
               "explained_min": rounded(self.explained_min), "coverage": self.coverage,
               "complete": self.complete}
        if self.normed:
            out["neuron_write"] = rounded(self.neuron_write)
            out["down_projection_set"] = list(self.down_units or ())
        return out


def complete_set(
    post0: Float[Tensor, "batch d_mlp"], out0: Float[Tensor, " batch"],
    w: Float[Tensor, " d_mlp"], coverage: float, layer: int, channel: int,
) -> SuperNeuronSet:
    """Rank neurons by mean contribution in the direction of the down projection's write
    ``sum_n post_n W_out[n, channel]``; take the fewest whose sum reaches ``coverage`` of it.

    The share is taken of the down projection's output without its bias (a bias is the same at
    every position: it is not a position-0 write). Where no norm follows the MLP, this is what
    reaches the residual stream and zeroing the set removes exactly its share; after a post-MLP
    norm use :func:`residual_set`."""
    contrib = post0.double() * w.double()[None]  # [batch, d_mlp]
    down = contrib.sum(1)  # [batch]
    mean_c = contrib.mean(0)
    total = float(down.mean())
    sign = 1.0 if total >= 0 else -1.0
    order = torch.argsort(sign * mean_c, descending=True, stable=True)
    cum = torch.cumsum(sign * mean_c[order], 0)
    reached = torch.nonzero(cum >= coverage * abs(total))
    complete = bool(len(reached)) and total != 0
    k = int(reached[0]) + 1 if complete else int((sign * mean_c > 0).sum())
    chosen = order[:k]
    explained = float(mean_c[chosen].sum() / total) if total else float("nan")
    per_seq = contrib[:, chosen].sum(1) / down
    return SuperNeuronSet(layer, channel, float(out0.double().mean()), total,
                          tuple((int(n), float(mean_c[n])) for n in chosen),
                          explained, float(per_seq.min()), coverage, complete)


MAX_RESIDUAL_SET = 64  # greedy steps of residual_set before it reports an incomplete set
POST_NORM_BASIS = ("residual write after the post-MLP norm (shares: what zeroing the neurons "
                   "removes from hook_mlp_out, run through the model's own norm)")


POOL = 64  # residual_set's candidates: this many by channel write and as many by output size


def candidate_pool(
    post0: Float[Tensor, "batch d_mlp"], w_out: Float[Tensor, "d_mlp d_model"], channel: int,
    size: int = POOL,
) -> Int[Tensor, " pool"]:
    """The neurons :func:`residual_set` tries: the ``size`` largest mean ``|post W_out[n, c]|``
    (what writes the channel) and the ``size`` largest mean ``post^2 |W_out[n]|^2`` (what sets
    the norm's denominator); a neuron outside both moves neither."""
    writes = (post0 * w_out[:, channel][None]).abs().mean(0)
    loud = (post0.square() * w_out.square().sum(1)[None]).mean(0)
    k = min(size, post0.shape[1])
    return torch.unique(torch.cat([writes.topk(k).indices, loud.topk(k).indices]))


@torch.no_grad()
def residual_set(
    post0: Float[Tensor, "batch d_mlp"], out0: Float[Tensor, " batch"],
    w_out: Float[Tensor, "d_mlp d_model"], b_out: Float[Tensor, " d_model"], norm: PostNorm,
    coverage: float, layer: int, channel: int, max_size: int = MAX_RESIDUAL_SET,
) -> SuperNeuronSet:
    """The fewest neurons whose zeroing at position 0 removes ``coverage`` of what the block
    writes into ``channel`` *after its post-MLP norm*: greedily, each step adds the neuron whose
    zeroing lowers the (signed, summed over sequences) residual write most, every candidate run
    through ``norm`` (the model's own module) as the model would run it. The candidates are
    :func:`candidate_pool`'s (at most ``2 x POOL`` neurons).

    The neurons' write is ``norm(y)_c - norm(b_out)_c`` with ``y = post @ W_out + b_out`` (the
    bias alone is no position-0 write); a neuron's contribution is its marginal removal when it
    joined the set."""
    p, w = post0.float(), w_out.float()
    y = p @ w + b_out.float()  # [batch, d_model]
    normed = norm(y).float()[:, channel]
    base = norm(b_out.float()[None]).float()[0, channel]
    neuron_write = normed - base  # [batch]
    total = float(neuron_write.double().mean())
    sign = 1.0 if total >= 0 else -1.0
    pool = candidate_pool(p, w, channel)
    pw = p[:, pool, None] * w[pool][None]  # [batch, pool, d_model]: each candidate's write
    cur = y.clone()
    current = normed.clone()
    chosen: list[tuple[int, float]] = []
    taken = torch.zeros(len(pool), dtype=torch.bool)
    for _ in range(min(max_size, len(pool))):
        if total != 0 and sign * float((normed - current).double().mean()) >= coverage * abs(total):
            break
        cand = norm(cur[:, None] - pw).float()[..., channel]  # [batch, pool]
        gain = sign * (current[:, None] - cand).double().mean(0)  # mean lowering per neuron
        gain[taken] = -float("inf")
        best = int(gain.argmax())
        if not gain[best] > 0:
            break
        taken[best] = True
        chosen.append((int(pool[best]), sign * float(gain[best])))
        cur -= pw[:, best]
        current = cand[:, best]
    removed = (normed - current).double()
    explained = float(removed.mean() / total) if total else float("nan")
    per_seq = removed / neuron_write.double()
    raw = complete_set(post0, out0, w_out[:, channel], coverage, layer, channel)
    return SuperNeuronSet(layer, channel, float(out0.double().mean()), raw.down_write,
                          tuple(chosen), explained, float(per_seq.min()), coverage,
                          bool(total != 0 and explained >= coverage), POST_NORM_BASIS, total,
                          tuple(raw.units))


@dataclass(frozen=True)
class SuperNeuronSets:
    """What the complete-set analysis reads: every layer's down-projection input and MLP output
    at position 0 per sequence, and every spike anywhere (Yu et al.'s criterion, all neurons)."""

    threshold: float
    coverage: float
    post0: Float[Tensor, "batch layer d_mlp"]
    out0: Float[Tensor, "batch layer d_model"]
    resid0: Float[Tensor, "batch layer d_model"]  # hook_resid_post at position 0
    median: Float[Tensor, "batch layer"]  # median |hook_resid_post| over positions and channels
    w_out: Float[Tensor, "layer d_mlp d_model"]
    # (layer, neuron, channel, position, activation, contribution) per spike
    spikes: tuple[tuple[int, int, int, int, float, float], ...]
    # per block the norm between the down projection and the residual add (None: none)
    post_norms: tuple[PostNorm | None, ...] = field(default=(), repr=False)
    b_out: Float[Tensor, "layer d_model"] | None = field(default=None, repr=False)

    @classmethod
    def merge(cls, parts: Sequence[SuperNeuronSets]) -> SuperNeuronSets:
        first = parts[0]
        return cls(first.threshold, first.coverage,
                   *(torch.cat([getattr(p, f) for p in parts])
                     for f in ("post0", "out0", "resid0", "median")),
                   first.w_out, tuple(s for p in parts for s in p.spikes), first.post_norms,
                   first.b_out)

    def post_norm(self, layer: int) -> PostNorm | None:
        """Block ``layer``'s post-MLP norm, or None."""
        return self.post_norms[layer] if layer < len(self.post_norms) else None

    def set_of(self, layer: int, channel: int) -> SuperNeuronSet:
        """The complete set of block ``layer`` for ``channel``, on what reaches the residual
        stream (:func:`residual_set` after a post-MLP norm, else :func:`complete_set`)."""
        post0, out0 = self.post0[:, layer], self.out0[:, layer, channel]
        norm = self.post_norm(layer)
        if norm is None:
            return complete_set(post0, out0,
                                self.w_out[layer, :, channel].to(post0.device, torch.float32),
                                self.coverage, layer, channel)
        b_out = (torch.zeros(self.w_out.shape[2]) if self.b_out is None else self.b_out[layer])
        return residual_set(post0, out0, self.w_out[layer].to(post0.device), b_out, norm,
                            self.coverage, layer, channel)

    def spiking_neurons(self) -> list[SpikingNeuron]:
        """Every neuron that met the spike criterion, grouped by (layer, neuron, channel)."""
        groups: dict[tuple[int, int, int], list[tuple[int, float, float]]] = {}
        for layer, neuron, channel, pos, act, contrib in self.spikes:
            groups.setdefault((layer, neuron, channel), []).append((pos, act, contrib))
        out = []
        for (layer, neuron, channel), rows in groups.items():
            positions = [r[0] for r in rows]
            out.append(SpikingNeuron(layer, neuron, channel,
                                     max(set(positions), key=positions.count),
                                     sum(r[1] for r in rows) / len(rows),
                                     sum(r[2] for r in rows) / len(rows), len(rows)))
        return sorted(out, key=lambda s: (s.layer, -abs(s.contribution), s.neuron))

    def massive_channels(self) -> list[int]:
        """Channels massive at position 0 after some block (Sun et al. 2024: mean ``|x| > 100``
        and ``>= 1000 x`` the layer's median magnitude)."""
        mag = self.resid0.double().abs().mean(0)  # [layer, d_model]
        ref = self.median.double().mean(0)[:, None]
        hit = (mag > MASSIVE_ABS) & (mag >= MASSIVE_RATIO * ref)
        return sorted({int(c) for c in torch.nonzero(hit)[:, 1]})

    def channels(self) -> list[tuple[int, int]]:
        """(layer, channel) pairs: a massive channel into which the layer's MLP writes more than
        the spike threshold at position 0 (mean over sequences)."""
        mean = self.out0.double().mean(0).abs()
        return [(layer, c) for layer in range(mean.shape[0]) for c in self.massive_channels()
                if mean[layer, c] > self.threshold]

    def sets(self) -> list[SuperNeuronSet]:
        """The complete set of every (layer, channel) the MLP writes a spike into at position 0."""
        return [self.set_of(layer, channel) for layer, channel in self.channels()]

    def to_frame(self) -> Any:
        """One row per complete set: layer, channel, write, size, neurons, explained share."""
        sets = self.sets()
        return frame({"layer": [s.layer for s in sets], "channel": [s.channel for s in sets],
                      "write": [s.write for s in sets], "size": [len(s.neurons) for s in sets],
                      "neurons": [[n for n, _ in s.neurons] for s in sets],
                      "explained": [s.explained for s in sets],
                      "complete": [s.complete for s in sets]})

    def to_dict(self) -> dict[str, Any]:
        return {"super_neuron_sets": {
            "criterion": {"spike_threshold": self.threshold, "coverage": self.coverage,
                          "position": 0, "input_hook": HOOKS[0], "output_hook": HOOKS[1],
                          "post_mlp_norm_blocks": [lay for lay in range(self.post0.shape[1])
                                                   if self.post_norm(lay) is not None],
                          "massive_channels": self.massive_channels(),
                          "massive_rule": f"mean |hook_resid_post[l, 0, c]| > {MASSIVE_ABS:g} "
                                          f"and >= {MASSIVE_RATIO:g} x the layer's median |x|"},
            "spiking_neurons": [s.to_dict() for s in self.spiking_neurons()],
            "sets": [s.to_dict() for s in self.sets()]}}


def super_neuron_sets(
    cache: CacheLike,
    w_out: Float[Tensor, "layer d_mlp d_model"],
    threshold: float = SPIKE_THRESHOLD,
    coverage: float = COVERAGE,
    *,
    post_norms: Sequence[PostNorm | None] = (),
    b_out: Float[Tensor, "layer d_model"] | None = None,
) -> SuperNeuronSets:
    """Complete super-neuron sets (Yu et al. 2024, detection of *every* spike, not only the
    largest): each neuron with ``|post| > threshold`` at a position where some output channel
    has ``|mlp_out| > threshold``, and, at position 0, the inputs and outputs the ranked sets
    are built from (after merging chunks), for the channels massive at position 0.
    ``post_norms``: per block the norm the model applies to the MLP output before the residual
    add (:func:`mechsink.model.post_mlp_norms`; empty: none), with the down projection's
    ``b_out``: the sets are then found on the normed write (:func:`residual_set`)."""
    post = stacked(cache, HOOKS[0]).float()  # [layer, batch, pos, d_mlp]
    out = stacked(cache, HOOKS[1]).float()  # [layer, batch, pos, d_model]
    resid = stacked(cache, SET_HOOKS[2]).float()  # [layer, batch, pos, d_model]
    w = w_out.detach()  # kept as it is (no float32 copy of every layer, see mlp_spikes)
    spikes = []
    out_spiking = out.abs() > threshold  # [layer, batch, pos, d_model]
    hits = torch.nonzero((post.abs() > threshold) & out_spiking.any(-1, keepdim=True))
    for layer, b, pos, neuron in hits.tolist():
        act = float(post[layer, b, pos, neuron])
        chans = torch.nonzero(out_spiking[layer, b, pos])[:, 0]
        contrib = act * w[layer, neuron, chans.to(w.device)].to(post.device, torch.float32)
        best = int(contrib.abs().argmax())
        spikes.append((layer, neuron, int(chans[best]), pos, act, float(contrib[best])))
    # clone(): a slice would keep the whole [layer, batch, pos, ...] stack alive with the result
    # (the census keeps one result per chunk until it merges them).
    return SuperNeuronSets(float(threshold), float(coverage),
                           *(x[:, :, 0].transpose(0, 1).cpu().clone() for x in (post, out, resid)),
                           resid.abs().flatten(2).median(-1).values.transpose(0, 1).cpu(),
                           w, tuple(spikes), tuple(post_norms),
                           None if b_out is None else b_out.detach().float().cpu())
