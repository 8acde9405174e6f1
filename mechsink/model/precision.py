"""Half precision: how far each number type reaches, and what an error says when a value left it.

A model loaded with ``dtype="float16"`` holds no value above 65504 (its largest finite number);
a massive activation (Sun et al. 2024, "Massive Activations in Large Language Models": residual
channels thousands of times the median, in the thousands on real models) or a gradient can pass
that and become inf. bfloat16 has float32's range (about 3.4e38) with fewer digits.
:func:`overflow_advice` is the sentence every error about a non-finite value adds, naming the
dtype and what to load instead; :func:`guard_overflow` turns an inf in the residual stream of a
half-precision run into that error (the interventions readout runs under it). The measured
tolerances of half precision against float32 are in the docs' architectures reference
("Precision") and ``tests/architectures/test_precision.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model.adapter import true_dtype
from mechsink.model.hooks import act_name, has_hook

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


@contextmanager
def guard_overflow(model: Any) -> Iterator[None]:
    """Within the block, a half-precision model whose residual stream becomes inf (a value
    beyond float16's range) raises a :class:`BadInputError` naming the block and the dtype,
    instead of running on into NaN sink scores and losses. Nothing is checked in float32."""
    dtype = true_dtype(model)
    if dtype not in LARGEST:
        yield
        return
    names = [n for layer in range(int(model.cfg.n_layers))
             for n in (act_name("resid_pre", layer), act_name("resid_post", layer))
             if has_hook(model, n)]

    def check(name: str) -> Any:
        def hook(act: Tensor, hook: Any) -> None:
            if torch.isinf(act).any():
                raise BadInputError(f"{name} holds inf (a value beyond the dtype's range)."
                                    + overflow_advice(dtype))

        return hook

    with model.hooks(fwd_hooks=[(n, check(n)) for n in names]):
        yield
