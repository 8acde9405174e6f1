"""How position 0 differs in size: first-token norm ratio, value drain, head output norms.

- first-token norm ratio ``||x[l,0]|| / mean_{p>0} ||x[l,p]||`` on ``hook_resid_post``;
- value drain ``||v[l,h,0]|| / mean_{p>0} ||v[l,h,p]||`` on ``attn.hook_v``. With grouped-query
  attention ``hook_v`` holds one value vector per *KV* head, so value drain is reported per KV
  head (query head ``h`` reads KV head ``h // (n_heads / n_kv_heads)``);
- head output norm: mean over positions of ``||z[p,h] @ W_O[h]||`` (``attn.hook_z``), per query
  head. A head is *dormant* when its norm is below ``dormant_frac`` times the median head norm
  of its layer (default 0.1).

All ratios are taken per sequence, then averaged over sequences.
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

RESID_HOOKS = ("hook_resid_post",)
VALUE_HOOKS = ("attn.hook_v",)
HEAD_HOOKS = ("attn.hook_z",)
DORMANT_FRAC = 0.1


def first_vs_rest(norms: Float[Tensor, "... pos"]) -> Float[Tensor, "..."]:
    """``norms[..., 0] / mean(norms[..., 1:])``."""
    if norms.shape[-1] < 2:
        raise BadInputError("a norm ratio needs at least two positions.")
    return norms[..., 0] / norms[..., 1:].mean(-1)


@dataclass(frozen=True)
class PerSequence:
    """A per-sequence measurement ``[batch, ...]``, merged by concatenation, reported as mean."""

    name: str
    values: Float[Tensor, "batch ..."]

    @classmethod
    def merge(cls, parts: Sequence[PerSequence]) -> PerSequence:
        return cls(parts[0].name, torch.cat([p.values for p in parts]))

    @property
    def mean(self) -> Tensor:
        return self.values.double().mean(0)

    def to_frame(self) -> Any:
        """One row per layer (and KV head, for the value drain): mean, min and max over
        sequences."""
        v = self.values.double()
        index = ("layer", "kv_head")[: v.dim() - 1]
        return grid_frame(index, {self.name: v.mean(0), "min": v.amin(0), "max": v.amax(0)})

    def to_dict(self) -> dict[str, Any]:
        return {self.name: rounded_list(self.mean),
                f"{self.name}_min": rounded_list(self.values.double().amin(0)),
                f"{self.name}_max": rounded_list(self.values.double().amax(0))}


def first_token_norm_ratio(cache: CacheLike) -> PerSequence:
    """``||x[l,0]|| / mean_{p>0} ||x[l,p]||`` per sequence and layer."""
    resid = stacked(cache, RESID_HOOKS[0]).float()  # [layer, batch, pos, d]
    ratio = first_vs_rest(resid.norm(dim=-1))
    return PerSequence("first_token_norm_ratio", ratio.transpose(0, 1).cpu())


def value_drain(cache: CacheLike) -> PerSequence:
    """``||v[l,h,0]|| / mean_{p>0} ||v[l,h,p]||`` per sequence, layer and KV head."""
    v = stacked(cache, VALUE_HOOKS[0]).float()  # [layer, batch, pos, kv_head, d_head]
    ratio = first_vs_rest(v.norm(dim=-1).transpose(-1, -2))  # [layer, batch, kv_head]
    return PerSequence("value_drain", ratio.transpose(0, 1).cpu())


@dataclass(frozen=True)
class HeadNorms:
    """Mean output norm of every head per sequence, and the dormant-head rule."""

    norms: Float[Tensor, "batch layer head"]
    dormant_frac: float = DORMANT_FRAC

    @classmethod
    def merge(cls, parts: Sequence[HeadNorms]) -> HeadNorms:
        return cls(torch.cat([p.norms for p in parts]), parts[0].dormant_frac)

    @property
    def mean(self) -> Float[Tensor, "layer head"]:
        return self.norms.double().mean(0)

    @property
    def ratio_to_layer_median(self) -> Float[Tensor, "layer head"]:
        m = self.mean
        return m / m.median(dim=1, keepdim=True).values

    def dormant(self) -> list[dict[str, Any]]:
        ratio = self.ratio_to_layer_median
        return [{"layer": int(layer), "head": int(h), "norm": rounded(self.mean[layer, h]),
                 "ratio_to_layer_median": rounded(ratio[layer, h])}
                for layer, h in torch.nonzero(ratio < self.dormant_frac).tolist()]

    def to_frame(self) -> Any:
        """One row per (layer, head): mean output norm, its ratio to the layer median and
        whether the head is dormant."""
        df = grid_frame(("layer", "head"), {"norm": self.mean,
                                            "ratio_to_layer_median": self.ratio_to_layer_median})
        df["dormant"] = df["ratio_to_layer_median"] < self.dormant_frac
        return df

    def to_dict(self) -> dict[str, Any]:
        return {"head_output_norm": rounded_list(self.mean),
                "dormant_rule": f"mean head output norm < {self.dormant_frac} x layer median",
                "dormant_heads": self.dormant()}


def head_output_norms(
    cache: CacheLike,
    w_o: Float[Tensor, "layer head d_head d_model"],
    dormant_frac: float = DORMANT_FRAC,
) -> HeadNorms:
    """Mean over positions of ``||z[p,h] @ W_O[h]||`` per sequence, layer and head."""
    z = stacked(cache, HEAD_HOOKS[0])  # [layer, batch, pos, head, d_head]
    # one layer at a time: every head's write [batch, pos, head, d_model] of all layers at
    # once would be the census's largest tensor (n_heads x the residual stream, per layer)
    norms = torch.stack([
        torch.einsum("bphd,hdm->bphm", z[layer].float(),
                     w_o[layer].detach().to(z.device, torch.float32)).norm(dim=-1).mean(dim=1)
        for layer in range(z.shape[0])])  # [layer, batch, head]
    return HeadNorms(norms.transpose(0, 1).cpu(), float(dormant_frac))
