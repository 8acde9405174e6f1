"""The GPT-2 query-bias split of attention logits (claim C6; seeds/001b).

With ``q_i = x_i W_Q + b_Q`` and ``k_j = x_j W_K + b_K`` (``x`` the normalised residual that
enters attention), the pre-softmax logit of query ``i`` to key ``j`` is

    s_ij = [ b_Q . (x_j W_K)  +  (x_i W_Q) . (x_j W_K)  +  q_i . b_K ] / sqrt(d_head).

The first term, ``Delta_j``, does not depend on the query: a key that scores high on it is
attended to by every query alike (a sink). The last term depends only on ``i`` and cancels in
the softmax. :func:`split_attention_logits` returns ``Delta`` and the rest; they sum to the
model's own ``hook_attn_scores`` on the causal part.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor


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
