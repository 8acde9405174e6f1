"""Intervals over prompts with the coverage they claim, and the rule for calling two apart.

Every figure of the causal-chain experiments is a mean over prompts and carries a 95% interval
of that mean. Which interval depends on the number of prompts ``n``, decided by simulation
(20,000 simulated data sets per cell; tests/test_stats.py keeps the figures honest):

- ``n < BOOTSTRAP_FROM`` (64): Student's t interval, ``mean +- t(n-1) s / sqrt(n)``
  (Student 1908, "The Probable Error of a Mean"). On normal data it covers the true mean
  94.8-95.0% of the time at n = 4, 8, 16, 32. The percentile bootstrap over prompts (Efron &
  Tibshirani 1993, "An Introduction to the Bootstrap") does not: 79.8% at n = 4, 88.2% at
  n = 8, 91.4% at n = 16, 93.2% at n = 32 (with n = 4 there are 35 distinct resamples and the
  "95%" interval is about the range of the four values, and it shrinks every interval by
  ``sqrt((n - 1) / n)`` and uses the normal quantile, not t's).
- ``n >= BOOTSTRAP_FROM``: the percentile bootstrap (93.8% at n = 64 on normal data, within
  1.5 points; it needs no normal mean, which at this n the t interval no longer gains from).

Skewed data cover less with either method (the t interval on exponential data: 87.9% at
n = 4, 89.2% at n = 8, 91.8% at n = 16, 92.9% at n = 32; the bootstrap lower still), which is
why verdicts that rest on two intervals being apart, or an interval clearing a threshold, are
not called below ``MIN_N_APART`` (8) prompts: at n = 4 a skewed per-prompt figure's interval
misses the mean about one time in eight, and the t quantile (3.18) makes it too wide to
separate anything but gross effects. Such verdicts then read :data:`TOO_FEW`.

Paired designs (the same prompts measured clean and intervened) take the interval of the
per-prompt differences (:func:`paired_interval`), not two intervals compared for overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from scipy.stats import t as student_t
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.cache import rounded

LEVEL = 0.95
N_BOOT = 2000
BOOTSTRAP_FROM = 64  # below this many prompts the percentile bootstrap under-covers: t instead
MIN_N_APART = 8  # below this many prompts no verdict calls two intervals apart
TOO_FEW = "too few prompts to call"
T_METHOD = "student t"
BOOT_METHOD = "percentile bootstrap"


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` prompts with its ``level`` interval made by ``method``; ``note`` says
    why an interval has zero width (every prompt gave the same value, or there was one prompt).
    ``method`` and ``n`` are None for intervals read back from results written before they
    were recorded."""

    mean: float
    low: float
    high: float
    note: str | None = None
    method: str | None = None
    n: int | None = None

    def overlaps(self, other: Interval) -> bool:
        return not (self.high < other.low or other.high < self.low)

    @property
    def callable(self) -> bool:
        """Whether a verdict may rest on this interval (enough prompts; unknown n: yes, as
        the results that did not record it were judged)."""
        return self.n is None or self.n >= MIN_N_APART

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mean": rounded(self.mean), "low": rounded(self.low), "high": rounded(self.high)}
        if self.method is not None:
            out["method"] = self.method
        if self.n is not None:
            out["n"] = self.n
        if self.note is not None:
            out["note"] = self.note
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Interval:
        """The inverse of :meth:`to_dict` (``method``, ``n``, ``note`` optional)."""
        return cls(d["mean"], d["low"], d["high"], d.get("note"), d.get("method"), d.get("n"))

    def __str__(self) -> str:
        text = f"{self.mean:.3g} [{self.low:.3g}, {self.high:.3g}]"
        if self.n is not None:
            text += f" n={self.n}"
        return text if self.note is None else f"{text} ({self.note})"


def interval_text(d: dict[str, Any] | None, spec: str = ".3f") -> str:
    """An interval dict as ``mean [low, high] n=N`` (n when recorded), or ``n/a``."""
    if d is None:
        return "n/a"
    text = f"{d['mean']:{spec}} [{d['low']:{spec}}, {d['high']:{spec}}]"
    return text + (f" n={d['n']}" if d.get("n") is not None else "")


def apart(a: Interval, b: Interval) -> bool | None:
    """Whether two intervals are apart; None when either rests on fewer than
    :data:`MIN_N_APART` prompts (too few to call)."""
    if not (a.callable and b.callable):
        return None
    return not a.overlaps(b)


def resample_indices(n: int, n_boot: int, seed: int) -> Int[Tensor, "boot n"]:
    """``n_boot`` resamples of ``n`` prompts with replacement, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(n, (n_boot, n), generator=gen)


def _check(level: float) -> None:
    if not 0.0 < level < 1.0:
        raise BadInputError(f"level must lie strictly between 0 and 1, got {level!r}.")


def t_bounds(values: Float[Tensor, "sets n"], level: float = LEVEL
             ) -> tuple[Float[Tensor, " sets"], Float[Tensor, " sets"]]:
    """Student's t interval of the mean of each row (``n >= 2``), vectorised over rows."""
    n = values.shape[-1]
    half = float(student_t.ppf(0.5 + level / 2, n - 1)) * values.std(-1) / n ** 0.5
    mean = values.mean(-1)
    return mean - half, mean + half


def percentile_bounds(values: Float[Tensor, "sets n"], level: float = LEVEL,
                      n_boot: int = N_BOOT, seed: int = 0
                      ) -> tuple[Float[Tensor, " sets"], Float[Tensor, " sets"]]:
    """The percentile-bootstrap interval of the mean of each row: the rows' prompts resampled
    with replacement ``n_boot`` times (one index draw from ``seed`` shared by every row)."""
    idx = resample_indices(values.shape[-1], n_boot, seed)
    means = values[:, idx].mean(-1)  # [sets, boot]
    alpha = (1.0 - level) / 2
    q = torch.quantile(means, torch.tensor([alpha, 1.0 - alpha], dtype=means.dtype), dim=-1)
    return q[0], q[1]


def _as_values(values: Float[Tensor, " n"] | Sequence[float], what: str) -> Tensor:
    v = torch.as_tensor(values, dtype=torch.float64).flatten()
    if v.numel() == 0:
        raise BadInputError(f"{what} needs at least one value.")
    return v


def bootstrap_interval(
    values: Float[Tensor, " n"] | Sequence[float],
    *,
    level: float = LEVEL,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> Interval:
    """Mean of ``values`` (one per prompt) and its percentile-bootstrap ``level`` interval
    (resample the prompts with replacement ``n_boot`` times). Under-covers below
    :data:`BOOTSTRAP_FROM` prompts: :func:`mean_interval` picks the method by ``n``."""
    v = _as_values(values, "bootstrap_interval")
    _check(level)
    low, high = percentile_bounds(v[None], level, n_boot, seed)
    return Interval(float(v.mean()), float(low[0]), float(high[0]), degenerate_reason(v),
                    BOOT_METHOD, int(v.numel()))


def t_interval(values: Float[Tensor, " n"] | Sequence[float], *, level: float = LEVEL
               ) -> Interval:
    """Mean of ``values`` and Student's t ``level`` interval (one value: zero width, noted)."""
    v = _as_values(values, "t_interval")
    _check(level)
    if v.numel() == 1:
        mean = float(v[0])
        return Interval(mean, mean, mean, degenerate_reason(v), T_METHOD, 1)
    low, high = t_bounds(v[None], level)
    return Interval(float(v.mean()), float(low[0]), float(high[0]), degenerate_reason(v),
                    T_METHOD, int(v.numel()))


def mean_interval(
    values: Float[Tensor, " n"] | Sequence[float],
    *,
    level: float = LEVEL,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> Interval:
    """The interval mechsink puts on a mean over prompts: Student's t below
    :data:`BOOTSTRAP_FROM` prompts, the percentile bootstrap from there on (see the module
    doc for the simulated coverage behind the rule)."""
    v = _as_values(values, "mean_interval")
    if v.numel() < BOOTSTRAP_FROM:
        return t_interval(v, level=level)
    return bootstrap_interval(v, level=level, n_boot=n_boot, seed=seed)


def paired_interval(
    after: Float[Tensor, " n_after"] | Sequence[float],
    before: Float[Tensor, " n_before"] | Sequence[float],
    *,
    level: float = LEVEL,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> Interval:
    """The interval of the mean per-prompt difference ``after - before`` (the same prompts
    measured twice): the prompt-to-prompt spread both share cancels."""
    a, b = _as_values(after, "paired_interval"), _as_values(before, "paired_interval")
    if a.shape != b.shape:
        raise BadInputError(f"paired_interval needs the same prompts twice: got {a.numel()} "
                            f"and {b.numel()} values.")
    return mean_interval(a - b, level=level, n_boot=n_boot, seed=seed)


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
