"""Architecture edits that stay hookable: head-wise RMSNorm and attention variants that give a head
somewhere other than token 0 to put "nothing".

Head-wise RMSNorm (Li et al. 2026, "The Structural Origin of Attention Sink") normalises each
head's value-aggregation output ``z`` (the attention-weighted sum of values, before ``W_O``) to
unit RMS and multiplies it by a learnable per-head gain. Position 0 (whose ``z`` is its own
value vector) and later positions (whose ``z`` averages many values) then have equal scale.

It is applied by replacing each attention block's output projection with
:class:`HeadwiseRMSNormOut`, which holds the original projection. In a TransformerBridge,
``blocks.{l}.attn.hook_z`` still sees ``z`` *before* the norm (it is the input of the replaced
projection); the normalised, gained ``z`` is what enters ``W_O``.

The attention variants (:data:`ATTENTION_VARIANTS`, Llama-family models only) follow the same
shape: each attention module's output projection is replaced by :class:`AttentionVariantOut`,
which holds the variant's parameters, its pattern function (what replaces the softmax over keys)
and what it does to ``z`` before ``W_O``. The name is recorded in ``config.mechsink_variants``
and re-applied when an organism is loaded. The transformers forward and the TransformerBridge
both compute the pattern with :meth:`AttentionVariantOut.pattern` (the patches
:mod:`~mechsink.model.patches.variant_attention` and
:mod:`~mechsink.model.patches.variant_patterns`), so ``hook_attn_scores`` (the
scaled, masked logits), ``hook_pattern`` (the weights that multiply the values), ``hook_z`` and
the rest keep their meaning:

- ``softmax1``: Miller 2023, "Attention Is Off By One": ``exp(s_j) / (1 + sum_k exp(s_k))``.
- ``sink_logit``: a learnable per-head logit joins the softmax's denominator (OpenAI 2025,
  "gpt-oss-120b & gpt-oss-20b Model Card"; Xiao et al. 2024's "sink token" without a token).
- ``gated``: Qiu et al. 2025, "Gated Attention for Large Language Models: Non-linearity,
  Sparsity, and Attention-Sink-Free": ``z * sigmoid(x W_g + b_g)`` per head and channel, ``x``
  the attention block's (normed) input; ``hook_z`` is ``z`` before the gate.
- ``softpick``: Zuhri et al. 2025, "Softpick: No Attention Sink, No Massive Activations with
  Rectified Softmax": ``relu(exp(s_j) - 1) / sum_k |exp(s_k) - 1|`` over visible keys.
- ``sigmoid``: Gu et al. 2024, "When Attention Sink Emerges in Language Models: An Empirical
  View": ``sigmoid(s_j)`` with no normalisation over keys.
- ``kv_bias``: Sun et al. 2024, "Massive Activations in Large Language Models": a learnable key
  ``k'`` and value ``v'`` per head form a slot that is not a token; the softmax runs over the
  keys and ``k'`` (scored by the un-rotated query: the slot has no position) and the slot's share
  times ``v'`` is added to ``z`` before ``W_O`` (``hook_z`` is ``z`` without it).

For the variants whose weights do not sum to one, ``hook_pattern`` holds the weights on the real
keys only (as gpt-oss's sink is shown in TransformerLens). Where a variant has no normalisation
over keys (``sigmoid``), :func:`sink_pattern` turns the pattern into each head's share of
output mass per key, and that share at key 0 is its "sink score".
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from mechsink.errors import BadInputError
from mechsink.model.patches import variant_attention

HEADWISE_RMSNORM = "headwise_rmsnorm"
ATTENTION_VARIANTS = ("softmax1", "sink_logit", "gated", "softpick", "sigmoid", "kv_bias")
UNNORMALISED = frozenset({"sigmoid"})  # no normalisation over keys: sink score = output share


class HeadwiseRMSNormOut(nn.Module):
    """RMS-normalise each head's slice of the input, scale by a gain, then project."""

    def __init__(self, proj: nn.Module, n_heads: int, d_head: int, eps: float = 1e-6):
        super().__init__()
        self.proj = proj
        self.n_heads, self.d_head, self.eps = n_heads, d_head, eps
        self.gain = nn.Parameter(torch.ones(n_heads, d_head))

    def normalise(
        self, z: Float[Tensor, "*batch pos heads_x_dhead"]
    ) -> Float[Tensor, "*batch pos heads d_head"]:
        """Each head's ``z`` divided by its RMS (before the gain)."""
        heads = z.unflatten(-1, (self.n_heads, self.d_head))
        return heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, z: Tensor) -> Tensor:
        return self.proj((self.normalise(z) * self.gain).flatten(-2))


def _attention_blocks(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(attention module, name of its output projection) for each layer of a GPT-2 / Llama."""
    if hasattr(model, "transformer") and hasattr(model.transformer, "h"):
        return [(block.attn, "c_proj") for block in model.transformer.h]
    if hasattr(model, "model") and hasattr(model.model, "layers"):
        return [(layer.self_attn, "o_proj") for layer in model.model.layers]
    raise NotImplementedError(
        f"head-wise RMSNorm knows GPT-2 and Llama-style models, not {type(model).__name__}."
    )


def _record(config: Any, name: str) -> None:
    variants = set(getattr(config, "mechsink_variants", []) or [])
    config.mechsink_variants = sorted(variants | {name})


def apply_headwise_rmsnorm(model: nn.Module) -> nn.Module:
    """Insert head-wise RMSNorm before every output projection of a transformers model (in place).

    The gains start at one, so the model's function changes (z is rescaled) but nothing else.
    """
    config = model.config
    n_heads = config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    for attn, name in _attention_blocks(model):
        proj = getattr(attn, name)
        if isinstance(proj, HeadwiseRMSNormOut):
            continue
        setattr(attn, name, HeadwiseRMSNormOut(proj, n_heads, d_head))
    _record(config, HEADWISE_RMSNORM)
    return model


# --- attention variants --------------------------------------------------------------------


def masked_keys(scores: Float[Tensor, "... k"]) -> Tensor:
    """Where the causal (or padding) mask hid a key: -inf, or the dtype's minimum added."""
    return scores <= torch.finfo(scores.dtype).min / 2


def softmax_with_slot(scores: Float[Tensor, "b h q k"], slot: Float[Tensor, "b h q 1"]
                      ) -> tuple[Float[Tensor, "b h q k"], Float[Tensor, "b h q"]]:
    """Softmax over the keys and one extra logit ``slot``: (weights on the keys, the slot's)."""
    weights = torch.softmax(torch.cat([scores, slot.to(scores.dtype)], dim=-1), dim=-1)
    return weights[..., :-1], weights[..., -1]


def softpick(scores: Float[Tensor, "... k"], eps: float = 1e-6) -> Float[Tensor, "... k"]:
    """Zuhri et al. 2025's rectified softmax over the visible keys, computed stably:
    ``relu(e^{s-m} - e^{-m}) / (sum |e^{s-m} - e^{-m}| + eps)`` with ``m = max(s, 0)``."""
    hidden = masked_keys(scores)
    m = scores.masked_fill(hidden, 0.0).amax(-1, keepdim=True).clamp(min=0).detach()
    shifted = (torch.exp(scores.masked_fill(hidden, 0.0) - m) - torch.exp(-m))
    shifted = shifted.masked_fill(hidden, 0.0)
    return torch.relu(shifted) / (shifted.abs().sum(-1, keepdim=True) + eps)


class AttentionVariantOut(nn.Module):
    """One attention module's variant: its parameters, its pattern function and its output step.

    It replaces the module's output projection (``proj`` is the original), so the bridge's
    ``hook_z`` sees ``z`` as the heads produce it and the variant's output step (gate, slot
    value) comes after. A forward hook on the query projection keeps the block's input and the
    un-rotated queries of the current forward for the gate and the key/value slot.
    """

    def __init__(self, kind: str, proj: nn.Module, n_heads: int, d_head: int, d_model: int,
                 scaling: float):
        super().__init__()
        if kind not in ATTENTION_VARIANTS:
            raise BadInputError(f"unknown attention variant {kind!r}: choose one of "
                                f"{', '.join(ATTENTION_VARIANTS)}.")
        self.kind, self.proj = kind, proj
        self.n_heads, self.d_head, self.scaling = n_heads, d_head, scaling
        self._seen: dict[str, Tensor] = {}
        if kind == "sink_logit":
            self.sink_logit = nn.Parameter(torch.zeros(n_heads))
        elif kind == "gated":
            self.gate = nn.Linear(d_model, n_heads * d_head)
            nn.init.normal_(self.gate.weight, std=0.02)
            nn.init.zeros_(self.gate.bias)
        elif kind == "kv_bias":
            self.k_bias = nn.Parameter(torch.randn(n_heads, d_head) * 0.02)
            self.v_bias = nn.Parameter(torch.randn(n_heads, d_head) * 0.02)

    def remember(self, module: nn.Module, inputs: tuple, output: Tensor) -> None:
        """Forward hook of the query projection: keep its input and output for this forward."""
        self._seen = {"x": inputs[0], "q": output}

    def pattern(self, scores: Float[Tensor, "b h q k"], dtype: torch.dtype | None = None
                ) -> Float[Tensor, "b h q k"]:
        """The weights that multiply the values, from scaled, masked logits (what replaces
        the softmax over keys)."""
        work = scores.float()
        if self.kind == "gated":
            out = torch.softmax(work, dim=-1)
        elif self.kind == "softmax1":
            out, _ = softmax_with_slot(work, torch.zeros_like(work[..., :1]))
        elif self.kind == "sink_logit":
            slot = self.sink_logit.float().view(1, -1, 1, 1).expand(*work.shape[:-1], 1)
            out, _ = softmax_with_slot(work, slot)
        elif self.kind == "softpick":
            out = softpick(work)
        elif self.kind == "sigmoid":
            out = torch.sigmoid(work).masked_fill(masked_keys(work), 0.0)
        else:  # kv_bias
            q = self._seen["q"].unflatten(-1, (self.n_heads, self.d_head))  # b q h d
            slot = torch.einsum("bqhd,hd->bhq", q.float(), self.k_bias.float()) * self.scaling
            out, share = softmax_with_slot(work, slot[..., None])
            self._seen["slot"] = share
        return out.to(dtype or scores.dtype)

    def forward(self, z: Float[Tensor, "b q heads_x_dhead"]) -> Tensor:
        if self.kind == "gated":
            z = z * torch.sigmoid(self.gate(self._seen["x"]))
        elif self.kind == "kv_bias":
            share = self._seen["slot"].transpose(1, 2)  # b q h
            z = z + (share[..., None] * self.v_bias).flatten(-2).to(z.dtype)
        return self.proj(z)


def apply_attention_variant(model: nn.Module, kind: str) -> nn.Module:
    """Give every attention module of a Llama-family transformers model the variant ``kind``
    (one of :data:`ATTENTION_VARIANTS`), in place; recorded in ``config.mechsink_variants``."""
    if kind not in ATTENTION_VARIANTS:
        raise BadInputError(f"unknown attention variant {kind!r}: choose one of "
                            f"{', '.join(ATTENTION_VARIANTS)}.")
    if not (hasattr(model, "model") and hasattr(model.model, "layers")):
        raise BadInputError(f"attention variants are built for Llama-family models, not "
                            f"{type(model).__name__}: use a llama recipe or model.")
    config = model.config
    done = [v for v in variants_of(config) if v in ATTENTION_VARIANTS and v != kind]
    if done:
        raise BadInputError(f"the model already has attention variant {done[0]!r}: one at a time.")
    n_heads = config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    for layer in model.model.layers:
        attn = layer.self_attn
        if isinstance(attn.o_proj, AttentionVariantOut):
            continue
        if isinstance(attn.o_proj, HeadwiseRMSNormOut):
            raise BadInputError("attention variants and head-wise RMSNorm do not combine yet.")
        variant = AttentionVariantOut(kind, attn.o_proj, n_heads, d_head, config.hidden_size,
                                      float(attn.scaling))
        attn.o_proj = variant
        attn.q_proj.register_forward_hook(variant.remember)
        attn.mechsink_variant = kind
        variant_attention.install(attn, variant.pattern)
    _record(config, kind)
    return model


def attention_variant_of(model_or_config: Any) -> str | None:
    """The attention variant recorded in a transformers config or model (None: softmax)."""
    config = getattr(model_or_config, "config", model_or_config)
    found = [v for v in variants_of(config) if v in ATTENTION_VARIANTS]
    return found[0] if found else None


def variant_pattern_fn(hf_attention: nn.Module) -> Any:
    """The pattern function of a transformers attention module with a variant (else None):
    what the bridge calls where it would take the softmax over keys."""
    return variant_attention.pattern_of(hf_attention)


def sink_pattern(pattern: Float[Tensor, "... q k"], variant: str | None
                 ) -> Float[Tensor, "... q k"]:
    """The pattern the sink score is read from: the pattern itself, except for a variant with
    no normalisation over keys (sigmoid), whose rows become each query's share of output mass
    per key (weights over their sum)."""
    if variant not in UNNORMALISED:
        return pattern
    return pattern / pattern.sum(-1, keepdim=True).clamp(min=1e-12)


def variants_of(config: Any) -> list[str]:
    """The mechsink variants recorded in a transformers config (empty for a plain model)."""
    return list(getattr(config, "mechsink_variants", []) or [])


def apply_variants(model: nn.Module, variants: list[str]) -> nn.Module:
    """Re-apply recorded variants (used when an organism is loaded)."""
    for variant in variants:
        if variant == HEADWISE_RMSNORM:
            apply_headwise_rmsnorm(model)
        elif variant in ATTENTION_VARIANTS:
            apply_attention_variant(model, variant)
        else:
            raise NotImplementedError(f"unknown mechsink variant {variant!r}")
    return model


__all__ = ["ATTENTION_VARIANTS", "AttentionVariantOut", "HEADWISE_RMSNORM", "HeadwiseRMSNormOut",
           "apply_attention_variant", "apply_headwise_rmsnorm", "apply_variants",
           "attention_variant_of", "masked_keys", "sink_pattern", "softmax_with_slot", "softpick",
           "variant_pattern_fn", "variants_of"]
