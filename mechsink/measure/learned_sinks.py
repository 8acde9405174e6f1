"""Learned and gated sinks: where a model has somewhere besides token 0 to put "nothing", how much
goes there, beside the position-0 sink.

**A learned sink slot.** GPT-OSS's attention has a learned per-head logit ``sinks`` that joins
the softmax as an extra column and is dropped afterwards (OpenAI 2025, "gpt-oss-120b &
gpt-oss-20b Model Card"); the training lab's ``softmax1``, ``sink_logit`` and ``kv_bias``
variants have such a slot too (:mod:`mechsink.model.variants`). ``hook_pattern`` holds the weights
on the real keys, so a row sums to less than one and the rest went to the slot::

    slot[l, h] = mean_{i >= 1} (1 - sum_j A[l,h,i,j])     key0[l, h] = mean_{i >= 1} A[l,h,i,0]

(the lab's accounting: the weight on key 0 as it multiplies the value), queries ``i >= 1``
(query 0 sees key 0 alone).

**An output gate.** Gated attention multiplies each head's output by ``sigmoid(x W_g)`` per head
and channel before the output projection (Qiu et al. 2025, "Gated Attention for Large Language
Models: Non-linearity, Sparsity, and Attention-Sink-Free"; Qwen3-Next's full-attention layers,
whose TransformerLens bridge exposes the gate logits as ``hook_q_gate`` and the gated output as
``hook_z``). The gate's suppression of a head's output is::

    passed[l, h] = mean_{i >= 1} ||z[l,i,h]|| / ||sum_j A[l,h,i,j] v[l,j,g(h)]||

(the gated output against the ungated one; 1: the gate lets everything through, 0: it silences
the head), with the mean gate ``sigmoid(gate)`` beside it. A head is a *sink head* on a sequence
when its key-0 weight exceeds ``eps`` (the census's rule); the census gives ``passed`` over the
sink heads and over the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.measure.cache import CacheLike, hook_name, rounded, rounded_list

SLOT_HOOKS = ("attn.hook_pattern",)
GATE_HOOKS = ("attn.hook_pattern", "attn.hook_v", "attn.hook_z", "attn.hook_q_gate")
SLOT_VARIANTS = ("softmax1", "sink_logit", "kv_bias")  # the lab's variants with a slot


@dataclass(frozen=True)
class AttentionExtras:
    """Which blocks have a learned sink slot and which an output gate (static facts of the
    model, found once)."""

    slot_layers: tuple[int, ...] = ()
    gate_layers: tuple[int, ...] = ()
    slot_kind: str = ""

    def hooks(self) -> tuple[str, ...]:
        """The hooks the measurement reads on such a model (none on a plain one)."""
        return tuple(dict.fromkeys((*(SLOT_HOOKS if self.slot_layers else ()),
                                    *(GATE_HOOKS if self.gate_layers else ()))))


def attention_extras(model: Any) -> AttentionExtras:
    """The blocks with a learned sink logit (GPT-OSS's ``sinks``, or a lab slot variant) and
    those whose bridge exposes an output gate (``attn.hook_q_gate``)."""
    from mechsink.model import has_learned_sink
    from mechsink.model.variants import attention_variant_of

    n_layers = int(model.cfg.n_layers)
    try:
        from mechsink.model.kinds import hf_model_of

        variant = attention_variant_of(hf_model_of(model))
    except Exception:  # noqa: BLE001 - a model with no transformers model behind it: no variant
        variant = None
    names = set(getattr(model, "hook_dict", {}) or {})
    if variant in SLOT_VARIANTS:
        slot, kind = tuple(range(n_layers)), f"attention variant {variant}"
    else:
        slot = tuple(lay for lay in range(n_layers) if has_learned_sink(model, lay))
        kind = "learned sink logit (attn.sinks)" if slot else ""
    gate = tuple(lay for lay in range(n_layers) if hook_name(lay, "attn.hook_q_gate") in names)
    return AttentionExtras(slot, gate, kind)


def slot_mass(pattern: Float[Tensor, "batch head query key"]) -> Float[Tensor, "batch head"]:
    """Mean over queries ``i >= 1`` of the weight not on any real key (``1 - sum_j A[i,j]``)."""
    return (1.0 - pattern.float()[:, :, 1:].sum(-1)).mean(-1)


def key0_mass(pattern: Float[Tensor, "batch head query key"]) -> Float[Tensor, "batch head"]:
    """Mean over queries ``i >= 1`` of the weight on key 0."""
    return pattern.float()[:, :, 1:, 0].mean(-1)


def gate_passed(
    pattern: Float[Tensor, "batch head query key"], v: Float[Tensor, "batch key kv_head d_head"],
    z: Float[Tensor, "batch query head d_head"], gate: Float[Tensor, "batch query gate"],
) -> tuple[Float[Tensor, "batch head"], Float[Tensor, "batch head"]]:
    """Per head, the mean over queries ``i >= 1`` of ``||z_i|| / ||sum_j A[i,j] v_j||`` (gated
    against ungated output; a zero ungated output counts as 1) and of ``sigmoid(gate)``."""
    n_heads, n_kv = pattern.shape[1], v.shape[2]
    vv = v.float().repeat_interleave(n_heads // n_kv, dim=2)
    ungated = torch.einsum("bhqk,bkhd->bqhd", pattern.float(), vv)[:, 1:].norm(dim=-1)
    gated = z.float()[:, 1:].norm(dim=-1)
    ratio = torch.where(ungated > 0, gated / ungated.clamp_min(torch.finfo(ungated.dtype).tiny),
                        torch.ones_like(gated))
    g = torch.sigmoid(gate.float()[:, 1:].unflatten(-1, (n_heads, -1))).mean(-1)
    return ratio.mean(1), g.mean(1)


@dataclass(frozen=True)
class LearnedSinks:
    """Per sequence, block of each kind (``slot_layers``, ``gate_layers``) and head: the slot's
    mass, the key-0 weight, the gate's pass ratio and mean gate (module doc)."""

    extras: AttentionExtras
    eps: float
    slot: Float[Tensor, "batch slot_layer head"]
    slot_key0: Float[Tensor, "batch slot_layer head"]
    passed: Float[Tensor, "batch gate_layer head"]
    gate: Float[Tensor, "batch gate_layer head"]
    gate_key0: Float[Tensor, "batch gate_layer head"]

    @classmethod
    def merge(cls, parts: Sequence[LearnedSinks]) -> LearnedSinks:
        first = parts[0]
        return cls(first.extras, first.eps,
                   *(torch.cat([getattr(p, f) for p in parts])
                     for f in ("slot", "slot_key0", "passed", "gate", "gate_key0")))

    def to_dict(self) -> dict[str, Any]:
        """Nothing for a model with neither (the census's JSON is then as it was)."""
        out: dict[str, Any] = {}
        if self.extras.slot_layers:
            slot, key0 = self.slot.double().mean(0), self.slot_key0.double().mean(0)
            out["slot"] = {
                "kind": self.extras.slot_kind, "layers": list(self.extras.slot_layers),
                "slot_mass": rounded_list(slot, 4), "key0_mass": rounded_list(key0, 4),
                "mean_slot_mass": rounded(slot.mean(), 4),
                "mean_key0_mass": rounded(key0.mean(), 4)}
        if self.extras.gate_layers:
            sink = self.gate_key0 > self.eps
            passed = self.passed.double()
            out["gate"] = {
                "layers": list(self.extras.gate_layers),
                "passed": rounded_list(passed.mean(0), 4),
                "mean_gate": rounded_list(self.gate.double().mean(0), 4),
                "key0_mass": rounded_list(self.gate_key0.double().mean(0), 4),
                "passed_sink_heads": rounded(passed[sink].mean(), 4) if sink.any() else None,
                "passed_other_heads": rounded(passed[~sink].mean(), 4) if (~sink).any()
                else None,
                "sink_head_share": rounded(sink.double().mean(), 4)}
        if not out:
            return {}
        return {"learned_sinks": {
            "method": "queries i >= 1; slot_mass: mean of 1 - sum_j A[i,j] (hook_pattern holds "
                      "the weights on the real keys); key0_mass: mean A[i,0]; passed: mean "
                      "||z_i|| / ||sum_j A[i,j] v_j|| (gated over ungated head output); sink "
                      f"heads: key0_mass > {self.eps:g} per sequence",
            **out}}


def learned_sinks(cache: CacheLike, extras: AttentionExtras | None, eps: float
                  ) -> LearnedSinks:
    """The module doc's numbers for the blocks ``extras`` names (none: empty tensors)."""
    extras = extras or AttentionExtras()
    first = (*extras.slot_layers, *extras.gate_layers)
    shape = cache[hook_name(first[0], "attn.hook_pattern")].shape if first else (0, 0)
    batch, n_heads = int(shape[0]), int(shape[1])

    def per(layers: Sequence[int], fn: Any) -> list[Tensor]:
        rows = [fn(lay) for lay in layers]
        if not rows:
            return [torch.zeros(batch, 0, n_heads)] * 2
        return [torch.stack([r[i] for r in rows], 1).cpu() for i in range(len(rows[0]))]

    def slot_of(lay: int) -> tuple[Tensor, Tensor]:
        a = cache[hook_name(lay, "attn.hook_pattern")]
        return slot_mass(a), key0_mass(a)

    def gate_of(lay: int) -> tuple[Tensor, Tensor, Tensor]:
        a = cache[hook_name(lay, "attn.hook_pattern")]
        passed, g = gate_passed(a, cache[hook_name(lay, "attn.hook_v")],
                                cache[hook_name(lay, "attn.hook_z")],
                                cache[hook_name(lay, "attn.hook_q_gate")])
        return passed, g, key0_mass(a)

    slot, key0 = per(extras.slot_layers, slot_of)
    gated = per(extras.gate_layers, gate_of)
    if len(gated) == 2:
        gated.append(torch.zeros(batch, 0, n_heads))
    return LearnedSinks(extras, float(eps), slot, key0, *gated)
