"""The GPT-2 query-bias split of attention logits (GPT-2-style models with a
learned query bias and absolute positions).

With ``q_i = x_i W_Q + b_Q`` and ``k_j = x_j W_K + b_K`` (``x`` the normalised residual that
enters attention), the pre-softmax logit of query ``i`` to key ``j`` is

    s_ij = [ b_Q . (x_j W_K)  +  (x_i W_Q) . (x_j W_K)  +  q_i . b_K ] / sqrt(d_head).

The first term, ``Delta_j``, does not depend on the query: a key that scores high on it is
attended to by every query alike (a sink). The last term depends only on ``i`` and cancels in
the softmax. :func:`split_attention_logits` returns ``Delta`` and the rest from the weights;
they sum to the model's own ``hook_attn_scores`` on the causal part. :func:`delta_attribution`
splits ``Delta`` further over the residual pieces. The split of a model's logits into the four
bilinear parts, rotated as the model rotates them, is
:func:`mechsink.measure.logit_split.bias_logit_split` (also importable from here).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.measure.logit_split import BIAS_PARTS, BiasSplit, bias_logit_split
from mechsink.model import act_name

__all__ = ["BIAS_PARTS", "BiasSplit", "LogitSplit", "bias_logit_split", "delta_attribution",
           "residual_components", "split_attention_logits"]


@dataclass(frozen=True)
class LogitSplit:
    """``scores = delta[..., None, :] + rest`` (masked positions excluded)."""

    delta: Float[Tensor, "batch head key"]
    rest: Float[Tensor, "batch head query key"]

    def total(self) -> Float[Tensor, "batch head query key"]:
        return self.delta[:, :, None, :] + self.rest


def split_attention_logits(
    x: Float[Tensor, "batch pos d_model"],
    W_Q: Float[Tensor, "head d_model d_head"],
    b_Q: Float[Tensor, "head d_head"],
    W_K: Float[Tensor, "head d_model d_head"],
    b_K: Float[Tensor, "head d_head"],
) -> LogitSplit:
    """Split one layer's attention logits into the query-independent ``Delta_j`` and the rest."""
    scale = math.sqrt(W_Q.shape[-1])
    q_lin = torch.einsum("bpd,hde->bhpe", x, W_Q)
    k_lin = torch.einsum("bpd,hde->bhpe", x, W_K)
    delta = torch.einsum("he,bhke->bhk", b_Q, k_lin) / scale
    content = torch.einsum("bhqe,bhke->bhqk", q_lin, k_lin)
    query_only = torch.einsum("bhqe,he->bhq", q_lin + b_Q[None, :, None], b_K)
    return LogitSplit(delta=delta, rest=(content + query_only[..., None]) / scale)


def residual_components(cache: Any, layer: int) -> dict[str, Tensor]:
    """The named pieces whose sum is the residual stream entering ``layer`` (GPT-2 style):
    token embedding, position embedding, and every earlier attention and MLP output."""
    parts = {"token embedding": cache["hook_embed"], "position embedding": cache["hook_pos_embed"]}
    for earlier in range(layer):
        parts[f"attn {earlier} out"] = cache[act_name("attn_out", earlier)]
        parts[f"mlp {earlier} out"] = cache[act_name("mlp_out", earlier)]
    return parts


def delta_attribution(
    parts: dict[str, Float[Tensor, "batch pos d_model"]],
    scale: Float[Tensor, "batch pos 1"],
    ln_w: Float[Tensor, " d_model"],
    ln_b: Float[Tensor, " d_model"] | None,
    W_K: Float[Tensor, "head d_model d_head"],
    b_Q: Float[Tensor, "head d_head"],
    position: int = 0,
) -> dict[str, Float[Tensor, "batch head"]]:
    """Split ``Delta`` at one key position over the residual pieces, LayerNorm scale frozen.

    With the normalisation's scale held at its real value, LayerNorm is linear in its input:
    piece ``c`` contributes ``b_Q . (((c - mean c) / scale * w) W_K) / sqrt(d_head)``; the
    LayerNorm bias contributes the rest. The contributions sum to ``Delta`` exactly.
    """
    root = math.sqrt(W_K.shape[-1])
    keys_of_bq = torch.einsum("hde,he->hd", W_K, b_Q) / root  # b_Q W_K^T per head: [head, d]
    out = {}
    for name, piece in parts.items():
        c = piece[:, position]
        c = (c - c.mean(-1, keepdim=True)) / scale[:, position] * ln_w
        out[name] = c @ keys_of_bq.T
    if ln_b is not None:
        out["LayerNorm bias"] = (ln_b @ keys_of_bq.T).expand(len(scale), -1)
    return out
