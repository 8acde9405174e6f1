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
    """A mean over prompts with its percentile-bootstrap interval; ``note`` says why an
    interval has zero width (every prompt gave the same value, or there was one prompt)."""

    mean: float
    low: float
    high: float
    note: str | None = None

    def overlaps(self, other: Interval) -> bool:
        return not (self.high < other.low or other.high < self.low)

    def to_dict(self) -> dict[str, float | str | None]:
        out: dict[str, float | str | None] = {
            "mean": rounded(self.mean), "low": rounded(self.low), "high": rounded(self.high)}
        if self.note is not None:
            out["note"] = self.note
        return out

    def __str__(self) -> str:
        text = f"{self.mean:.3g} [{self.low:.3g}, {self.high:.3g}]"
        return text if self.note is None else f"{text} ({self.note})"


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
    return Interval(float(v.mean()), float(low), float(high), degenerate_reason(v))


def degenerate_reason(values: Float[Tensor, " n"]) -> str | None:
    """Why an interval over these per-prompt values has zero width, or None when it need not:
    one prompt, or every prompt giving the same value (under causal attention position 0 sees
    only its own token, so after a shared first token such as BOS its state, and everything read
    from it alone, is the same in every prompt)."""
    if values.numel() == 1:
        return "one prompt: no spread to resample"
    if bool((values == values[0]).all()):
        return ("every prompt gives the same value (e.g. read at position 0 after the same "
                "first token, which causal attention makes the same state in every prompt)")
    return None
