"""Variance discrepancy of the attention output (value non-mixing at position 0; Li, Jiang, Sun
et al. 2026, "The Structural Origin of Attention Sink").

``var[l, p]``: variance over sequences of ``hook_attn_out[l, p, c]``, averaged over channels c.
Position 0 attends only to itself, later positions average many values, so ``var[l, 0]`` is
expected to exceed ``mean_{p>0} var[l, p]``; the ratio of the two is the discrepancy. Beside it,
the uniform-mixing prediction ``sum_j A[l, h, p, j]^2`` (mean over heads and sequences), which is
1 at position 0. Kept as running sums so chunks of sequences merge exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.measure.cache import CacheLike, grid_frame, rounded_list, stacked

HOOKS = ("hook_attn_out", "attn.hook_pattern")


@dataclass(frozen=True)
class VarianceStats:
    """Sufficient statistics over sequences: count, sum and sum of squares of the attention
    output (float64), and the summed attention concentration ``sum_j A^2``."""

    count: int
    total: Float[Tensor, "layer pos d_model"]
    total_sq: Float[Tensor, "layer pos d_model"]
    concentration: Float[Tensor, "layer pos"]

    @classmethod
    def merge(cls, parts: Sequence[VarianceStats]) -> VarianceStats:
        return cls(sum(p.count for p in parts), sum(p.total for p in parts),  # type: ignore[arg-type]
                   sum(p.total_sq for p in parts), sum(p.concentration for p in parts))

    @property
    def variance(self) -> Float[Tensor, "layer pos"]:
        """Unbiased variance over sequences, mean over channels (NaN with one sequence)."""
        n = self.count
        mean = self.total / n
        var = (self.total_sq - n * mean**2) / (n - 1) if n > 1 else mean * float("nan")
        return var.clamp_min(0).mean(-1)

    @property
    def ratio(self) -> Float[Tensor, " layer"]:
        v = self.variance
        return v[:, 0] / v[:, 1:].mean(-1)

    @property
    def predicted(self) -> Float[Tensor, "layer pos"]:
        return self.concentration / self.count

    def to_frame(self) -> Any:
        """One row per (layer, position): the variance over sequences and the uniform-attention
        prediction (concentration)."""
        return grid_frame(("layer", "position"), {"variance": self.variance,
                                                  "predicted_concentration": self.predicted})

    def to_dict(self) -> dict[str, Any]:
        pred = self.predicted
        return {"variance_discrepancy": {
            "ratio": rounded_list(self.ratio),
            "variance": rounded_list(self.variance),
            "predicted_concentration": rounded_list(pred),
            "predicted_ratio": rounded_list(pred[:, 0] / pred[:, 1:].mean(-1)),
        }}


def variance_stats(cache: CacheLike) -> VarianceStats:
    """Running sums for the variance discrepancy from ``hook_attn_out`` and ``hook_pattern``."""
    out = stacked(cache, HOOKS[0])  # [layer, batch, pos, d]
    pattern = stacked(cache, HOOKS[1])  # [layer, batch, head, query, key]
    # float64 one layer at a time (a float64 copy of every layer would double the hooks)
    total, total_sq, conc = [], [], []
    for layer in range(out.shape[0]):
        x, a = out[layer].double(), pattern[layer].double()
        total.append(x.sum(0))
        total_sq.append((x**2).sum(0))
        conc.append((a**2).sum(-1).mean(1).sum(0))  # [pos]
    return VarianceStats(int(out.shape[1]), torch.stack(total).cpu(),
                         torch.stack(total_sq).cpu(), torch.stack(conc).cpu())
