"""Percentile-bootstrap intervals over prompts (Efron & Tibshirani 1993, "An Introduction to the
Bootstrap"): every figure of the causal-chain experiments carries one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure._cache import rounded

LEVEL = 0.95
N_BOOT = 2000


@dataclass(frozen=True)
class Interval:
    """A mean over prompts with its percentile-bootstrap interval."""

    mean: float
    low: float
    high: float

    def overlaps(self, other: Interval) -> bool:
        return not (self.high < other.low or other.high < self.low)

    def to_dict(self) -> dict[str, float | None]:
        return {"mean": rounded(self.mean), "low": rounded(self.low), "high": rounded(self.high)}

    def __str__(self) -> str:
        return f"{self.mean:.3g} [{self.low:.3g}, {self.high:.3g}]"


def resample_indices(n: int, n_boot: int, seed: int) -> Int[Tensor, "boot n"]:
    """``n_boot`` resamples of ``n`` prompts with replacement, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(n, (n_boot, n), generator=gen)


def bootstrap_interval(
    values: Float[Tensor, " n"] | Sequence[float],
    *,
    level: float = LEVEL,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> Interval:
    """Mean of ``values`` (one per prompt) and the percentile-bootstrap ``level`` interval of
    that mean: resample the prompts with replacement ``n_boot`` times."""
    v = torch.as_tensor(values, dtype=torch.float64).flatten()
    if v.numel() == 0:
        raise BadInputError("bootstrap_interval needs at least one value.")
    if not 0.0 < level < 1.0:
        raise BadInputError(f"level must lie strictly between 0 and 1, got {level!r}.")
    means = v[resample_indices(v.numel(), n_boot, seed)].mean(1)
    alpha = (1.0 - level) / 2
    low, high = torch.quantile(means, torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64))
    return Interval(float(v.mean()), float(low), float(high))
