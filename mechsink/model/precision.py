"""Half precision: how far each number type reaches, and what an error says when a value left it.

A model loaded with ``dtype="float16"`` holds no value above 65504 (its largest finite number);
a massive activation (Sun et al. 2024, "Massive Activations in Large Language Models": residual
channels thousands of times the median, in the thousands on real models) or a gradient can pass
that and become inf. bfloat16 has float32's range (about 3.4e38) with fewer digits.
:func:`overflow_advice` is the sentence every error about a non-finite value adds, naming the
dtype and what to load instead; the measured tolerances of half precision against float32 are
in the README ("Precision") and ``tests/architectures/test_precision.py``.
"""

from __future__ import annotations

import torch

#: the largest finite value of each half-precision dtype
LARGEST = {torch.float16: float(torch.finfo(torch.float16).max),
           torch.bfloat16: float(torch.finfo(torch.bfloat16).max)}


def overflow_advice(dtype: torch.dtype | None) -> str:
    """What to do about a non-finite value computed in ``dtype`` ('' for float32 / float64)."""
    if dtype == torch.float16:
        return (" The model runs in float16, whose largest value is 65504 (a massive activation, "
                "a logit or a gradient beyond it is inf): load it with dtype='bfloat16' (the "
                "same range as float32) or 'float32'.")
    if dtype == torch.bfloat16:
        return " The model runs in bfloat16: load it with dtype='float32' to check."
    return ""
