"""Key-bias cosine: does every query point at the first token's key (the sink key)?

Per layer and query head: ``first = mean_{i>0} cos(q_i, k_0)`` against
``rest = mean_{i>0} mean_{0<j<=i} cos(q_i, k_j)`` (only keys the query can see). The vectors are
the ones the attention score is made of: after the rotary embedding where the model has one
(``attn.hook_rot_q/k``), else ``attn.hook_q/k``; after the q/k norm where the model normalises
its queries and keys after the rotary embedding (HunYuan: ``attn.hook_q_normed/k_normed``, whose
``hook_rot_q/k`` hold the vectors before that norm). :func:`scored_qk_hooks` names them for a
model. With grouped-query attention query head ``h`` is compared with KV head
``h // (n_heads / n_kv_heads)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.cache import CacheLike, grid_frame, n_layers_in, rounded_list, stacked

PLAIN_HOOKS = ("attn.hook_q", "attn.hook_k")
ROTARY_HOOKS = ("attn.hook_rot_q", "attn.hook_rot_k")
#: the q/k norm's outputs, ``[batch, head, pos, d_head]``: the scored vectors where the norm
#: comes after the rotary embedding (TransformerLens's ``cfg.qk_norm_after_rope``)
NORMED_HOOKS = ("attn.hook_q_normed", "attn.hook_k_normed")


def scored_qk_hooks(model: Any) -> tuple[str, str]:
    """The hooks (per-block suffixes) holding the queries and keys the model's attention scores
    are made of: the q/k norm's outputs where it normalises after the rotary embedding
    (HunYuan), the rotated ones on a rotary model, else the plain projections."""
    from mechsink.model.probes import capabilities

    if bool(getattr(model.cfg, "qk_norm_after_rope", False)):
        return NORMED_HOOKS
    rotary = str(getattr(model.cfg, "positional_embedding_type", "")) == "rotary"
    return ROTARY_HOOKS if rotary or capabilities(model).rotary_qk else PLAIN_HOOKS


def qk_hooks_in(cache: CacheLike) -> tuple[str, str]:
    """The rotary hooks when the cache holds them, else the plain ones."""
    try:
        n_layers_in(cache, ROTARY_HOOKS[0])
        return ROTARY_HOOKS
    except BadInputError:
        return PLAIN_HOOKS


@dataclass(frozen=True)
class KeyBiasCosine:
    """Per sequence, layer and query head: mean cosine of queries with k_0 and with later keys."""

    first: Float[Tensor, "batch layer head"]
    rest: Float[Tensor, "batch layer head"]

    @classmethod
    def merge(cls, parts: Sequence[KeyBiasCosine]) -> KeyBiasCosine:
        return cls(torch.cat([p.first for p in parts]), torch.cat([p.rest for p in parts]))

    def to_frame(self) -> Any:
        """One row per (layer, head): mean cos(q, k_0) and mean cos(q, k_j>0)."""
        return grid_frame(("layer", "head"), {"first": self.first.double().mean(0),
                                              "rest": self.rest.double().mean(0)})

    def to_dict(self) -> dict[str, Any]:
        return {"key_bias_cosine": {"first": rounded_list(self.first.double().mean(0)),
                                    "rest": rounded_list(self.rest.double().mean(0))}}


def key_bias_cosine(cache: CacheLike, hooks: tuple[str, str] | None = None) -> KeyBiasCosine:
    """Mean cos(q_i, k_0) and mean cos(q_i, k_{0<j<=i}) over queries i > 0, of the queries and
    keys ``hooks`` (per-block suffixes; give :func:`scored_qk_hooks` of the model: the default,
    :func:`qk_hooks_in` the cache, reads HunYuan's vectors before its q/k norm)."""
    q_name, k_name = hooks if hooks is not None else qk_hooks_in(cache)
    q_all, k_all = stacked(cache, q_name), stacked(cache, k_name)
    if q_name in NORMED_HOOKS:  # [layer, batch, head, pos, d] -> [layer, batch, pos, head, d]
        q_all, k_all = q_all.transpose(2, 3), k_all.transpose(2, 3)
    # [layer, batch, pos, head, d_head]; one layer at a time (normalised and repeated copies of
    # every layer's queries and keys, and every cosine at once, would all be held together)
    n_heads, n_kv = q_all.shape[3], k_all.shape[3]
    if n_heads % n_kv:
        raise BadInputError(f"{n_heads} query heads do not share {n_kv} KV heads evenly.")
    n_pos = q_all.shape[2]
    if n_pos < 2:
        raise BadInputError("key-bias cosine needs at least two positions.")
    seen = torch.tril(torch.ones(n_pos, n_pos, dtype=torch.bool, device=q_all.device))
    seen[:, 0] = False
    seen = seen[1:]  # queries i > 0, keys 0 < j <= i
    firsts, rests = [], []
    for layer in range(q_all.shape[0]):
        q = q_all[layer].float()
        k = k_all[layer].float().repeat_interleave(n_heads // n_kv, dim=2)
        cos = torch.einsum("bihd,bjhd->bhij", F.normalize(q, dim=-1), F.normalize(k, dim=-1))
        firsts.append(cos[..., 1:, 0].mean(-1))
        rests.append(((cos[..., 1:, :] * seen).sum(-1) / seen.sum(-1)).mean(-1))
    first, rest = torch.stack(firsts), torch.stack(rests)  # [layer, batch, head]
    return KeyBiasCosine(first.transpose(0, 1).cpu(), rest.transpose(0, 1).cpu())
