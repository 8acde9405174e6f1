"""The GPT-2 query-bias split of attention logits (GPT-2-style models with a
learned query bias and absolute positions).

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
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model import act_name


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


BIAS_PARTS = ("content", "query bias", "key bias", "both biases")


@dataclass(frozen=True)
class BiasSplit:
    """One layer's attention logits as four bilinear parts (scaled as the model scales them):

    ``content`` ``(x_i W_Q) . (x_j W_K)``; ``query bias`` ``b_Q . (x_j W_K)`` (Delta_j);
    ``key bias`` ``(x_i W_Q) . b_K``; ``both biases`` ``b_Q . b_K``; each with the model's own
    rotation of queries and keys applied first when it has one (so under rotary positions the
    key-bias parts depend on the key's position and do not cancel in the softmax).
    """

    parts: dict[str, Float[Tensor, "batch head query key"]]

    def total(self) -> Float[Tensor, "batch head query key"]:
        return sum(self.parts.values())  # type: ignore[return-value]


@torch.no_grad()
def bias_logit_split(model: Any, tokens: Tensor, layer: int, *, tol: float = 1e-4) -> BiasSplit:
    """Split ``layer``'s attention logits into content, query-bias, key-bias and bias-bias parts.

    The model runs twice: as it is, and with ``b_Q``/``b_K`` subtracted from that layer's queries
    and keys before their rotation. The rotation is linear, so the biased-minus-unbiased rotated
    vectors are the rotated biases, and the four parts sum to the model's own
    ``hook_attn_scores`` (checked on the causal part to ``tol`` relative to the logits' scale).
    """
    from mechsink.model import has_hook, n_kv_heads, query_bias

    b_q = query_bias(model, layer)
    b_k_all = getattr(model, "b_K", None)
    d_head = int(model.cfg.d_head)
    b_q = torch.zeros(int(model.cfg.n_heads), d_head) if b_q is None else b_q
    b_k = (torch.zeros(n_kv_heads(model), d_head) if b_k_all is None
           else b_k_all[layer].detach())
    q_name, k_name = act_name("attn.hook_q", layer), act_name("attn.hook_k", layer)
    rq, rk = act_name("attn.hook_rot_q", layer), act_name("attn.hook_rot_k", layer)
    read_q = rq if has_hook(model, rq) else q_name
    read_k = rk if has_hook(model, rk) else k_name
    scores_name = act_name("attn.hook_attn_scores", layer)
    _, cache = model.run_with_cache(tokens, names_filter=[read_q, read_k, scores_name],
                                    stop_at_layer=layer + 1)
    seen: dict[str, Tensor] = {}

    def record(t: Tensor, hook: Any) -> None:
        seen[hook.name] = t.detach().clone()

    hooks = [(q_name, lambda q, hook: q - b_q.to(q.dtype)),
             (k_name, lambda k, hook: k - b_k.to(k.dtype)),
             (read_q, record), (read_k, record)]
    model.run_with_hooks(tokens, fwd_hooks=hooks, stop_at_layer=layer + 1)
    q_all, k_all = cache[read_q].double(), cache[read_k].double()  # [batch, pos, head, d]
    q_c, k_c = seen[read_q].double(), seen[read_k].double()
    q_b, k_b = q_all - q_c, k_all - k_c
    group = int(model.cfg.n_heads) // k_all.shape[2]
    k_c, k_b = (t.repeat_interleave(group, dim=2) for t in (k_c, k_b))
    attn_scale = float(getattr(model.cfg, "attn_scale", -1.0) or -1.0)
    s = 1.0 / (attn_scale if attn_scale > 0 else math.sqrt(d_head))

    def dot(a: Tensor, b: Tensor) -> Tensor:
        return s * torch.einsum("bqhe,bkhe->bhqk", a, b)

    parts = {"content": dot(q_c, k_c), "query bias": dot(q_b, k_c),
             "key bias": dot(q_c, k_b), "both biases": dot(q_b, k_b)}
    split = BiasSplit(parts)
    t = tokens.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    own = cache[scores_name].double()[..., causal]
    err = float((split.total()[..., causal] - own).abs().max())
    if err > tol * max(1.0, float(own.abs().max())):
        raise BadInputError(f"the four parts miss layer {layer}'s hook_attn_scores by {err:.3g}: "
                            "this attention is not supported by bias_logit_split.")
    return split
