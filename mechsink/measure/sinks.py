"""Sink score and sink rate (Gu et al. 2024, "When Attention Sink Emerges in Language Models").

``alpha_k = mean_{i >= k} A[i, k]``: the mean attention that queries at or after key position
``k`` pay to ``k``. Gu's version includes the query ``i = k`` (which, for ``k = 0``, attends to
itself with weight 1); ``include_self=False`` starts at ``i = k + 1``.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError


def sink_score(
    pattern: Float[Tensor, "batch head query key"],
    key_pos: int = 0,
    *,
    include_self: bool = True,
) -> Float[Tensor, "batch head"]:
    """Per sequence and head, the mean attention paid to ``key_pos`` by the queries after it."""
    n_query = pattern.shape[-2]
    if not 0 <= key_pos < pattern.shape[-1]:
        raise BadInputError(
            f"key_pos={key_pos} is outside the sequence (length {pattern.shape[-1]})."
        )
    first = key_pos if include_self else key_pos + 1
    if first >= n_query:
        raise BadInputError(
            f"no query comes after key_pos={key_pos} in a sequence of {n_query} tokens: "
            "use a longer sequence or include_self=True."
        )
    return pattern[..., first:, key_pos].mean(dim=-1)


def sink_rate(
    scores: Float[Tensor, "batch layer head"], eps: float = 0.3
) -> float:
    """Fraction of (layer, head) pairs with sink score above ``eps``, thresholded per sequence
    and then averaged over sequences (Gu et al. 2024)."""
    if not 0.0 < eps < 1.0:
        raise BadInputError(f"eps must lie in (0, 1), got {eps}.")
    return (scores > eps).to(torch.float64).mean().item()
