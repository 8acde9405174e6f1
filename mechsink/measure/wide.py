"""Reductions accumulate in float32 whatever the model's dtype.

A sum or mean taken in bfloat16 keeps 8 bits of mantissa: a sink score near 0.73 lands on a
grid of 1/256, so a patch's effect (a difference of two such values) comes out 0 or several
times too large. Every metric and census reduction reads its (small) slice through :func:`wide`
first; float32 and float64 tensors pass through untouched, so float32 models keep their
numbers bit for bit.
"""

from __future__ import annotations

import torch
from torch import Tensor


def wide(t: Tensor) -> Tensor:
    """``t`` in float32 when it is a floating tensor narrower than float32 (bfloat16,
    float16), otherwise ``t`` itself (autograd flows through the cast)."""
    if t.is_floating_point() and t.dtype.itemsize < 4:
        return t.to(torch.float32)
    return t
