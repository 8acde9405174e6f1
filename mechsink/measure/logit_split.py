"""Exact splits of an attention logit into parts that sum to the model's own ``hook_attn_scores``.

Both read one layer's queries and keys as the model computes them (after the rotary embedding
where it has one, one KV head shared by a group of query heads under grouped-query attention)
and check their parts against the model's scores before returning:

- :func:`bias_logit_split`: every query-key logit of a layer as four bilinear parts, content
  ``(x_i W_Q) . (x_j W_K)``, query bias ``b_Q . (x_j W_K)`` (Delta_j, the part no query changes),
  key bias ``(x_i W_Q) . b_K`` and both biases ``b_Q . b_K``;
- :func:`key_logit_split`: one head's logit to key 0 and to an ordinary key split by what made
  the key: the massive channel(s) of the key position's normalised residual, the rest of it, the
  key bias, and the rotary position term (Sun et al. 2024, "Massive Activations in Large Language
  Models": the sink's key is made by the massive channel).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.cache import rounded
from mechsink.measure.checks import check_channels
from mechsink.model import (
    act_name,
    attention_scale,
    has_hook,
    key_bias,
    key_weights,
    n_kv_heads,
    query_bias,
)

# --- shared: the scale, the rotated q/k, grouped heads, the check against the model -------------


def scored_qk_names(model: Any, layer: int) -> tuple[str, str]:
    """The hooks holding the queries and keys the scores are made of: rotated where the model
    rotates them, else the plain ones."""
    names = []
    for plain, rotated in (("attn.hook_q", "attn.hook_rot_q"), ("attn.hook_k", "attn.hook_rot_k")):
        name = act_name(rotated, layer)
        names.append(name if has_hook(model, name) else act_name(plain, layer))
    return names[0], names[1]


def _check_no_norm_after_rotary(model: Any, split: str) -> None:
    """A one-line refusal for a model that normalises its queries and keys after the rotary
    embedding (HunYuan): its logit is not bilinear in the biases or linear in the key input
    through a fixed-scale norm before the rotation, which both splits assume."""
    if bool(getattr(model.cfg, "qk_norm_after_rope", False)):
        arch = type(getattr(model, "original_model", model)).__name__
        raise BadInputError(
            f"{arch} normalises its queries and keys after the rotary embedding: the {split} "
            "assumes the rotation is the last step before the dot product; it would work with "
            "the norm's per-token scale held fixed after the rotation (not implemented).")


def _group_size(model: Any) -> int:
    """How many query heads share one KV head (1 without grouped-query attention)."""
    return int(model.cfg.n_heads) // n_kv_heads(model)


def _check_parts_sum(total: Tensor, own: Tensor, tol: float, what: str, split: str) -> float:
    """The largest ``|total - own|``; raises when it exceeds ``tol`` relative to the logits'
    scale (then ``split`` does not describe this model's attention)."""
    err = float((total - own).abs().max())
    if err > tol * max(1.0, float(own.abs().max())):
        raise BadInputError(f"{what} by {err:.3g}: this attention is not supported by {split}.")
    return err


# --- the four bilinear parts of a layer's logits ------------------------------------------------

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
def bias_logit_split(model: Any, tokens: Int[Tensor, "batch pos"], layer: int, *,
                     tol: float = 1e-4) -> BiasSplit:
    """Split ``layer``'s attention logits into content, query-bias, key-bias and bias-bias parts.

    The model runs twice: as it is, and with ``b_Q``/``b_K`` (per KV head) subtracted from that
    layer's queries and keys before their rotation. The rotation is linear, so the
    biased-minus-unbiased rotated vectors are the rotated biases, and the four parts sum to the
    model's own ``hook_attn_scores`` (checked on the causal part to ``tol`` relative to the
    logits' scale).
    """
    _check_no_norm_after_rotary(model, "bias logit split")
    d_head = int(model.cfg.d_head)
    b_q = query_bias(model, layer)
    b_q = torch.zeros(int(model.cfg.n_heads), d_head) if b_q is None else b_q
    b_k_all = key_bias(model)  # [layer, kv_head, d_head]: hook_k's layout on every model
    b_k = torch.zeros(n_kv_heads(model), d_head) if b_k_all is None else b_k_all[layer]
    q_name, k_name = act_name("attn.hook_q", layer), act_name("attn.hook_k", layer)
    read_q, read_k = scored_qk_names(model, layer)
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
    group = _group_size(model)
    k_c, k_b = (t.repeat_interleave(group, dim=2) for t in (k_c, k_b))
    s = 1.0 / attention_scale(model, layer)

    def dot(a: Tensor, b: Tensor) -> Tensor:
        return s * torch.einsum("bqhe,bkhe->bhqk", a, b)

    split = BiasSplit({"content": dot(q_c, k_c), "query bias": dot(q_b, k_c),
                       "key bias": dot(q_c, k_b), "both biases": dot(q_b, k_b)})
    t = tokens.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    _check_parts_sum(split.total()[..., causal], cache[scores_name].double()[..., causal], tol,
                     f"the four parts miss layer {layer}'s hook_attn_scores", "bias_logit_split")
    return split


# --- one head's logit to a key, split by what made the key --------------------------------------


@dataclass(frozen=True)
class LogitParts:
    """Mean over prompts and queries of one key's attention logit and its parts.

    ``massive``/``rest``: the key made by the massive channels / the other coordinates of the
    key position's normalised residual (the key projection's input), met by the query without
    rotation; ``key_bias``: ``b_K``'s part; ``rotary``: the logit minus the unrotated
    ``q . k`` (what the rotary position embedding adds); ``total``: the sum of the parts;
    ``model``: the model's own ``hook_attn_scores``; ``max_error``: max |total - model|.
    """

    key: int
    massive: float
    rest: float
    key_bias: float
    rotary: float
    total: float
    model: float
    max_error: float

    def to_dict(self) -> dict[str, Any]:
        return {k: (rounded(v) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass(frozen=True)
class KeyLogitSplit:
    """The logit split of one head for key 0 and an ordinary key ``j`` (queries ``i >= j``)."""

    layer: int
    head: int
    channels: tuple[int, ...]
    queries: tuple[int, int]
    sink_key: LogitParts
    other_key: LogitParts

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "head": self.head, "channels": list(self.channels),
                "queries": list(self.queries), "key_0": self.sink_key.to_dict(),
                "key_j": self.other_key.to_dict(),
                "gap": {p: rounded(getattr(self.sink_key, p) - getattr(self.other_key, p))
                        for p in ("massive", "rest", "key_bias", "rotary", "total")}}


def _key_input_name(model: Any, layer: int) -> str:
    """The key projection's input (the normalised residual): ``ln1.hook_out`` on a
    TransformerBridge, ``ln1.hook_normalized`` (gain applied) on a HookedTransformer."""
    for suffix in ("ln1.hook_out", "ln1.hook_normalized"):
        if has_hook(model, act_name(suffix, layer)):
            return act_name(suffix, layer)
    raise BadInputError(f"block {layer} has no normalised-residual hook before attention: "
                        "key-logit decomposition needs a pre-norm model.")


def _as_bphd(t: Tensor, ref: Tensor) -> Tensor:
    """``t`` in ``[batch, pos, head, d]`` layout; ``ref`` is a tensor known to be in it (the
    rotated one, equal to ``t`` at position 0 where the rotation is the identity)."""
    if t.shape == ref.shape and torch.allclose(t[:, 0], ref[:, 0], atol=1e-4, rtol=1e-4):
        return t
    tt = t.transpose(1, 2)
    if tt.shape == ref.shape and torch.allclose(tt[:, 0], ref[:, 0], atol=1e-4, rtol=1e-4):
        return tt
    raise BadInputError("could not line up the normalised q/k with the rotated ones: this "
                        "attention layout is not supported by key_logit_split.")


def _check_head_args(model: Any, layer: int, head: int, n_pos: int, other_key: int | None
                     ) -> int:
    """Every check before the forward; returns the ordinary key ``j`` (default: the middle)."""
    n_layers, n_heads = int(model.cfg.n_layers), int(model.cfg.n_heads)
    if not 0 <= layer < n_layers or not 0 <= head < n_heads:
        raise BadInputError(f"head L{layer}H{head} is out of range ({n_layers} layers, "
                            f"{n_heads} heads).")
    soft_cap = getattr(model.cfg, "attn_scores_soft_cap", -1.0) or -1.0
    if soft_cap > 0:
        raise BadInputError("this model soft-caps its attention scores: the logit is not a "
                            "sum of parts.")
    j = n_pos // 2 if other_key is None else int(other_key)
    if not 0 < j < n_pos:
        raise BadInputError(f"other_key must lie in 1..{n_pos - 1}, got {j}.")
    return j


@dataclass(frozen=True)
class _HeadVectors:
    """What the key-logit split reads of one head: the key input ``x``, the key projection of
    its KV group, the queries and keys before and after rotation, the fixed-scale key-norm
    factor and the model's scores (all float64)."""

    x: Float[Tensor, "batch pos d_model"]
    w_k: Float[Tensor, "d_model d_head"]
    b_k: Float[Tensor, " d_head"]
    q_unrot: Float[Tensor, "batch pos d_head"]
    q_fin: Float[Tensor, "batch pos d_head"]
    k_fin: Float[Tensor, "batch pos d_head"]
    factor: Float[Tensor, "batch pos d_head"]
    scores: Float[Tensor, "batch query key"]


def _head_vectors(model: Any, tokens: Tensor, layer: int, head: int) -> _HeadVectors:
    """One forward of ``tokens`` read for head ``(layer, head)`` (see :class:`_HeadVectors`);
    raises when the key input times ``W_K`` does not give the model's keys."""
    group = head // _group_size(model)

    def name(s: str) -> str:
        return act_name(s, layer)

    x_name = _key_input_name(model, layer)
    wanted = [x_name, name("attn.hook_q"), name("attn.hook_k"), name("attn.hook_attn_scores")]
    optional = [name(s) for s in ("attn.hook_rot_q", "attn.hook_rot_k", "attn.hook_q_normed",
                                  "attn.hook_k_normed") if has_hook(model, name(s))]
    _, cache = model.run_with_cache(tokens, names_filter=wanted + optional, return_type=None)
    x = cache[x_name].double()  # [batch, pos, d_model]
    w_k = key_weights(model)[layer, group].double().to(x.device)  # [d_model, d_head]
    b_all = key_bias(model)
    b = (b_all[layer, group].detach().double().to(x.device) if b_all is not None
         else torch.zeros(w_k.shape[1], dtype=torch.float64, device=x.device))
    k_model = cache[name("attn.hook_k")][:, :, group].double()
    scale_ref = float(k_model.abs().max()) or 1.0
    if float((x @ w_k + b - k_model).abs().max()) > 1e-3 * scale_ref:
        raise BadInputError(f"{x_name} @ W_K does not give the model's keys at layer {layer}: "
                            "this model's key projection is not supported.")
    rot_q = cache[name("attn.hook_rot_q")] if name("attn.hook_rot_q") in cache else None
    rot_k = cache[name("attn.hook_rot_k")] if name("attn.hook_rot_k") in cache else None
    q, k_all = cache[name("attn.hook_q")], cache[name("attn.hook_k")]
    if name("attn.hook_q_normed") in cache:
        q = _as_bphd(cache[name("attn.hook_q_normed")], rot_q if rot_q is not None else q)
    if name("attn.hook_k_normed") in cache:
        k_all = _as_bphd(cache[name("attn.hook_k_normed")], rot_k if rot_k is not None else k_all)
        k_unrot = k_all[:, :, group].double()
        # the key norm with its scale fixed: elementwise factor k_unrot / k_raw
        factor = torch.where(k_model != 0, k_unrot / torch.where(k_model != 0, k_model, 1.0),
                             torch.zeros_like(k_model))
    else:
        factor = torch.ones_like(k_model)
    return _HeadVectors(
        x, w_k, b, q[:, :, head].double(), (rot_q if rot_q is not None else q)[:, :, head].double(),
        (rot_k if rot_k is not None else k_all)[:, :, group].double(), factor,
        cache[name("attn.hook_attn_scores")][:, head].double())


@torch.no_grad()
def key_logit_split(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    layer: int,
    head: int,
    channels: Sequence[int],
    *,
    other_key: int | None = None,
    tol: float = 1e-4,
) -> KeyLogitSplit:
    """Split head ``(layer, head)``'s logit ``q_i . k_j`` (scaled as the model scales it) for
    key 0 and an ordinary key ``j`` (default: the middle position), over queries ``i >= j``.

    The key is linear in the key input ``x_j`` (``k = x_j W_K + b_K``), then, where the model
    has one, a key norm (linear once its per-token scale is fixed at the value the model used)
    and a rotation. The parts are ``x_j[channels] W_K`` and the rest of ``x_j`` (and ``b_K``)
    carried through the fixed-scale norm and met by the unrotated query; the rotary term is the
    model's logit minus the unrotated ``q . k``. Raises if the parts miss the model's own
    ``hook_attn_scores`` by more than ``tol`` (relative to the logit's scale).
    """
    _check_no_norm_after_rotary(model, "key logit split")
    n_pos = tokens.shape[1]
    j = _check_head_args(model, layer, head, n_pos, other_key)
    chans = check_channels(model, channels)
    v = _head_vectors(model, tokens, layer, head)
    s = 1.0 / attention_scale(model, layer)
    mask = torch.zeros(v.x.shape[-1], dtype=torch.bool, device=v.x.device)
    mask[chans] = True

    def parts_for(key: int) -> LogitParts:
        queries = torch.arange(j, n_pos, device=v.x.device)
        xk = v.x[:, key]  # [batch, d_model]
        k_mass = (xk * mask) @ v.w_k * v.factor[:, key]
        k_rest = (xk * ~mask) @ v.w_k * v.factor[:, key]
        k_bias = v.b_k[None] * v.factor[:, key]
        qi = v.q_unrot[:, queries]  # [batch, nq, d_head]
        massive = s * torch.einsum("bqe,be->bq", qi, k_mass)
        rest = s * torch.einsum("bqe,be->bq", qi, k_rest)
        bias = s * torch.einsum("bqe,be->bq", qi, k_bias)
        total = s * torch.einsum("bqe,be->bq", v.q_fin[:, queries], v.k_fin[:, key])
        own = v.scores[:, queries, key]
        err = _check_parts_sum(total, own, tol,
                               f"the rebuilt logit of L{layer}H{head} misses the model's "
                               "hook_attn_scores", "key_logit_split")
        return LogitParts(key, float(massive.mean()), float(rest.mean()), float(bias.mean()),
                          float((total - massive - rest - bias).mean()), float(total.mean()),
                          float(own.mean()), err)

    return KeyLogitSplit(layer, head, tuple(chans), (j, n_pos - 1), parts_for(0), parts_for(j))
