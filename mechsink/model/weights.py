"""The weights measurements read, per layer and per head, the same on either kind of model.

A HookedTransformer with grouped-query attention repeats each key/value head once per query
head in its ``W_K`` / ``b_K`` properties; a TransformerBridge does not. The accessors here give
one layout (per KV head) on both, :func:`attention_scale` the factor the attention logits
are divided by, and :func:`has_learned_sink` whether a block's softmax has a learned sink
logit, both read from the model's own attention modules.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model.kinds import is_hooked_transformer


def n_kv_heads(model: Any) -> int:
    """Number of key/value heads (== n_heads unless the model uses grouped-query attention)."""
    n = getattr(model.cfg, "n_key_value_heads", None)
    return int(n) if n else int(model.cfg.n_heads)


def _detached(model: Any, attr: str, what: str) -> Tensor:
    """``model.<attr>`` detached, or a clear error naming ``what`` when the model has none."""
    try:
        weight = getattr(model, attr)
    except (AttributeError, RuntimeError) as exc:
        raise BadInputError(f"this model exposes no {what} ({attr}): {exc}") from exc
    return weight.detach()


def down_projection(model: Any) -> Float[Tensor, "layer d_mlp d_model"]:
    """The MLP down projections stacked over layers, ``[layer, d_mlp, d_model]`` (raw weights,
    detached): ``mlp.hook_post @ W_out[l] (+ b_out) = hook_mlp_out``."""
    return _detached(model, "W_out", "MLP down projection")


def head_output_weights(model: Any) -> Float[Tensor, "layer head d_head d_model"]:
    """The attention output projections per head, ``[layer, head, d_head, d_model]`` (raw,
    detached): ``hook_z[..., h, :] @ W_O[l, h]`` is head ``h``'s write to the residual stream."""
    return _detached(model, "W_O", "attention output weights")


def _grouped(model: Any) -> bool:
    """A HookedTransformer with grouped-query attention: its ``W_K``/``b_K`` (and ``W_V``/``b_V``)
    properties repeat each KV head once per query head; the per-KV-head weights are ``_W_K``."""
    n_kv = getattr(model.cfg, "n_key_value_heads", None)
    return is_hooked_transformer(model) and bool(n_kv) and int(n_kv) != int(model.cfg.n_heads)


def key_weights(model: Any) -> Float[Tensor, "layer kv_head d_model d_head"]:
    """The key projections per KV head, ``[layer, kv_head, d_model, d_head]`` (raw, detached):
    ``hook_k[..., g, :] = x @ W_K[l, g] + b_K[l, g]`` on either kind of model."""
    if _grouped(model):
        return torch.stack([b.attn._W_K for b in model.blocks]).detach()
    return model.W_K.detach()


def key_bias(model: Any) -> Float[Tensor, "layer kv_head d_head"] | None:
    """The key biases per KV head, ``[layer, kv_head, d_head]`` (detached), or None when the
    model has none."""
    if _grouped(model):
        return torch.stack([b.attn._b_K for b in model.blocks]).detach()
    b_k = getattr(model, "b_K", None)
    return None if b_k is None else b_k.detach()


def value_weights(model: Any) -> Float[Tensor, "layer kv_head d_model d_head"]:
    """The value projections per KV head, ``[layer, kv_head, d_model, d_head]`` (raw,
    detached): ``hook_v[..., g, :] = x @ W_V[l, g] + b_V[l, g]`` on either kind of model."""
    if _grouped(model):
        return torch.stack([b.attn._W_V for b in model.blocks]).detach()
    return model.W_V.detach()


def projection_bias(model: Any, name: str, heads: int, layer: int = 0
                    ) -> Float[Tensor, "head d_head"] | None:
    """Block ``layer``'s projection bias ``name`` (``"b_Q"``, ``"b_K"`` or ``"b_V"``) as
    ``[head, d_head]`` for ``heads`` heads (per KV head for keys and values on a grouped-query
    HookedTransformer asked for fewer than ``n_heads``), detached; None when there is none."""
    if is_hooked_transformer(model) and name != "b_Q" and heads != int(model.cfg.n_heads):
        b = getattr(model.blocks[layer].attn, f"_{name}", None)
    else:
        try:
            b = getattr(model, name)
        except (AttributeError, RuntimeError):
            return None
        b = None if b is None else b[layer]
    return None if b is None else b.detach()


def query_bias(model: Any, layer: int) -> Float[Tensor, "head d_head"] | None:
    """The learned query bias ``b_Q`` of a block, ``[head, d_head]`` (detached), or None when
    the model's query projection has no bias (Llama, Gemma, SmolLM2)."""
    try:
        b_q = model.b_Q
    except (AttributeError, RuntimeError):
        return None
    return None if b_q is None else b_q[layer].detach()


def block_norm(model: Any, layer: int, which: str = "ln1") -> Any | None:
    """Block ``layer``'s normalisation module ``which`` (``ln1`` before attention, ``ln2``
    before the MLP, ``ln1_post`` after attention where the model has one), callable on a
    residual ``[..., d_model]`` as the model applies it; None where the block has none."""
    return getattr(model.blocks[layer], which, None)


def norm_params(model: Any, layer: int, which: str = "ln1") -> tuple[Tensor, Tensor | None]:
    """Gain and bias of a block's normalisation (``ln1`` before attention, ``ln2`` before the
    MLP); the bias is None for RMSNorm."""
    norm = getattr(model.blocks[layer], which)
    bias = getattr(norm, "b", None)
    return norm.w, bias


def norm_gain_bias(model: Any, layer: int, which: str = "ln1"
                   ) -> tuple[Tensor | None, Tensor | None]:
    """Gain and bias of block ``layer``'s normalisation ``which``, detached, each None where
    the norm has none (no bias on RMSNorm, neither on LNPre)."""
    norm = getattr(model.blocks[layer], which)
    w, b = getattr(norm, "w", None), getattr(norm, "b", None)
    return (None if w is None else w.detach()), (None if b is None else b.detach())


def attention_scale(model: Any, layer: int | None = None) -> float:
    """What the model divides each query-key dot product by before the softmax:
    ``hook_attn_scores = q . k / attention_scale`` (queries and keys as they enter the dot
    product: after rotary and any q/k norm).

    ``sqrt(d_head)`` for most models, ``sqrt(query_pre_attn_scalar)`` for Gemma, and ``layer + 1``
    times that in a GPT-2 built with ``scale_attn_by_inverse_layer_idx``. Without ``layer``,
    the scale every layer shares (a model whose layers differ must be asked per layer).
    """
    n_layers = int(model.cfg.n_layers)
    if layer is not None and not 0 <= layer < n_layers:
        raise BadInputError(f"layer {layer} is outside 0..{n_layers - 1}.")
    layers = range(n_layers) if layer is None else [layer]
    scales = [_layer_attention_scale(model, lay) for lay in layers]
    other = next((lay for lay, s in enumerate(scales) if s != scales[0]), None)
    if other is not None:
        raise BadInputError(
            f"this model's attention scale differs between layers ({scales[0]:g} at layer 0, "
            f"{scales[other]:g} at layer {other}): ask for one layer, "
            "attention_scale(model, layer).")
    return scales[0]


def _layer_attention_scale(model: Any, layer: int) -> float:
    attn = model.blocks[layer].attn
    if is_hooked_transformer(model):  # its own divisor (use_attn_scale, inverse layer index)
        return float(attn.attn_scale)
    # a bridge scores with the wrapped transformers module's ``scaling``, a multiplier that
    # holds every factor (head size, Gemma's query_pre_attn_scalar, GPT-2's layer index)
    scaling = getattr(getattr(attn, "original_component", None), "scaling", None)
    return 1.0 / float(scaling) if scaling else math.sqrt(int(model.cfg.d_head))


def has_learned_sink(model: Any, layer: int) -> bool:
    """Whether block ``layer``'s attention has a learned sink logit: a per-head parameter
    ``sinks`` joining the softmax as an extra key column that is dropped afterwards, so the
    pattern's rows sum to less than 1 (GPT-OSS; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model
    Card"). Read from the wrapped transformers module on a bridge; False on a
    HookedTransformer, whose attention has no such parameter."""
    attn = getattr(model.blocks[layer], "attn", None)
    inner = getattr(attn, "original_component", attn)
    return isinstance(getattr(inner, "sinks", None), Tensor)
