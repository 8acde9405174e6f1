"""Value-weighted sink share and the dormant / active sink heads it separates.

An attention-weight sink score (Gu et al. 2024) says where a head looks, not what it writes:
a head that pours its attention onto key 0 writes little there when ``v_0`` is small. The
share of the head's output that comes from key 0 tells the two apart (Guo et al. 2024,
"Active-Dormant Attention Heads: Mechanistically Demystifying Extreme-Token Phenomena in
LLMs")::

    share[l, h] = mean_{i >= 1} ||A[l,h,i,0] v[l,g(h),0]|| / ||sum_j A[l,h,i,j] v[l,g(h),j]||

over the queries ``i >= 1`` (query 0 sees only key 0, so its share is 1 by construction), in
the value space (before ``W_O``; ``sum_j A v_j`` is ``hook_z``). ``g(h)`` is the KV head query
head ``h`` reads under grouped-query attention (``h // (n_heads / n_kv_heads)``).

**Dormant / active.** On one sequence a head is a *sink head* when its Gu sink score of key 0
exceeds ``eps`` (the census's rule, 0.3); a sink head is *dormant* when its value-weighted share
is also below ``eps`` (it parks its attention on key 0 but little of what it writes comes from
there), *active* otherwise. The threshold is ours: the same ``eps`` on the value-weighted score
as on the weight score, so a head is dormant exactly when it is a sink by weight and not by
value. Heads are classified per sequence; the census reports the fraction of sequences in which
each head is dormant and, over all (sequence, layer, head), the share of sink heads that are
dormant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.cache import CacheLike, grid_frame, rounded, rounded_list, stacked
from mechsink.measure.sinks import DEFAULT_EPS, check_eps, sink_score

HOOKS = ("attn.hook_pattern", "attn.hook_v")


def key0_share(
    pattern: Float[Tensor, "batch head query key"],
    v: Float[Tensor, "batch key kv_head d_head"],
) -> Float[Tensor, "batch head"]:
    """Per sequence and query head, the mean over queries ``i >= 1`` of
    ``||A[i,0] v_0|| / ||sum_j A[i,j] v_j||`` (value heads shared under grouped-query
    attention). A query whose output is exactly zero counts with share 0."""
    n_heads, n_kv = pattern.shape[1], v.shape[2]
    if pattern.shape[-2] < 2:
        raise BadInputError("a value-weighted share needs at least two positions (it is "
                            "averaged over the queries after position 0).")
    if n_heads % n_kv:
        raise BadInputError(f"{n_heads} query heads cannot share {n_kv} value heads evenly.")
    v = v.float().repeat_interleave(n_heads // n_kv, dim=2)  # [batch, key, head, d_head]
    a = pattern.float()[:, :, 1:, :]  # queries i >= 1
    out = torch.einsum("bhqk,bkhd->bhqd", a, v).norm(dim=-1)
    from0 = a[..., 0] * v[:, 0].norm(dim=-1)[:, :, None]  # ||A[i,0] v_0||
    share = torch.where(out > 0, from0 / out.clamp_min(torch.finfo(out.dtype).tiny),
                        torch.zeros_like(out))
    return share.mean(-1)


@dataclass(frozen=True)
class ValueShare:
    """Per sequence, layer and query head: the value-weighted share of key 0 and Gu's weight
    sink score of key 0; the dormant rule of the module doc with threshold ``eps``."""

    share: Float[Tensor, "batch layer head"]
    weight: Float[Tensor, "batch layer head"]  # Gu's sink score of key 0
    eps: float = DEFAULT_EPS

    @classmethod
    def merge(cls, parts: Sequence[ValueShare]) -> ValueShare:
        return cls(torch.cat([p.share for p in parts]), torch.cat([p.weight for p in parts]),
                   parts[0].eps)

    @property
    def sink(self) -> Tensor:
        """Per sequence, whether each head is a sink head (weight score > eps)."""
        return self.weight > self.eps

    @property
    def dormant(self) -> Tensor:
        """Per sequence, whether each head is a dormant sink head (a sink by weight whose
        value-weighted share is below eps)."""
        return self.sink & (self.share < self.eps)

    @property
    def dormant_share(self) -> float | None:
        """Of every (sequence, layer, head) that is a sink head, the fraction that is dormant
        (None when no head is a sink)."""
        n_sink = int(self.sink.sum())
        return None if n_sink == 0 else int(self.dormant.sum()) / n_sink

    def heads(self) -> list[dict[str, Any]]:
        """Every head that is a sink head in at least half the sequences: its mean scores and
        the fraction of those sequences in which it is dormant."""
        sink_frac = self.sink.double().mean(0)
        rows = []
        for layer, head in torch.nonzero(sink_frac >= 0.5).tolist():
            sink = self.sink[:, layer, head]
            dormant = self.dormant[:, layer, head][sink].double().mean()
            rows.append({"layer": layer, "head": head,
                         "sink_score": rounded(self.weight[:, layer, head].double().mean()),
                         "value_share": rounded(self.share[:, layer, head].double().mean()),
                         "sink_fraction": rounded(sink_frac[layer, head]),
                         "dormant_fraction": rounded(dormant)})
        return rows

    def to_frame(self) -> Any:
        """One row per (layer, head): mean weight score, mean value-weighted share and the
        fractions of sequences in which the head is a sink head and a dormant one."""
        return grid_frame(("layer", "head"), {
            "sink_score": self.weight.double().mean(0),
            "value_share": self.share.double().mean(0),
            "sink_fraction": self.sink.double().mean(0),
            "dormant_fraction": self.dormant.double().mean(0)})

    def to_dict(self) -> dict[str, Any]:
        heads = self.heads()
        return {
            "value_share": rounded_list(self.share.double().mean(0)),
            "value_share_rule": (
                "mean over queries i >= 1 of ||A[i,0] v_0|| / ||sum_j A[i,j] v_j|| (value "
                f"space); a sink head (Gu score > {self.eps:g}) is dormant on a sequence when "
                f"its value share is < {self.eps:g} (Guo et al. 2024)"),
            "sink_heads_dormant_share": rounded(self.dormant_share),
            "sink_heads_value_share": heads,
            "sink_heads_mostly_dormant": sum(h["dormant_fraction"] > 0.5 for h in heads),
        }


def value_shares(cache: CacheLike, eps: float = DEFAULT_EPS) -> ValueShare:
    """The value-weighted share of key 0 and Gu's sink score of every head, per sequence, from
    ``attn.hook_pattern`` and ``attn.hook_v`` (one layer at a time)."""
    check_eps(eps)
    pattern = stacked(cache, HOOKS[0])  # [layer, batch, head, query, key]
    v = stacked(cache, HOOKS[1])  # [layer, batch, pos, kv_head, d_head]
    if v.shape[2] != pattern.shape[-1]:
        raise BadInputError(f"attn.hook_v has {v.shape[2]} positions and the pattern "
                            f"{pattern.shape[-1]} keys: cache both from one forward.")
    share = torch.stack([key0_share(pattern[layer], v[layer])
                         for layer in range(pattern.shape[0])])
    weight = torch.stack([sink_score(pattern[layer].float(), 0)
                          for layer in range(pattern.shape[0])])
    return ValueShare(share.transpose(0, 1).cpu(), weight.transpose(0, 1).cpu(), float(eps))
