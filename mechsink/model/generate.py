"""Greedy decoding through the hookable forward (no KV cache: short continuations only)."""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from mechsink.model.tokens import check_seq_len


@torch.no_grad()
def greedy_continue(
    model: Any, tokens: Int[Tensor, "batch pos"], n_new: int
) -> Int[Tensor, "batch new_pos"]:
    """Append ``n_new`` argmax tokens to ``tokens``, one full forward per token."""
    check_seq_len(model, tokens.shape[1] + n_new)
    out = tokens
    for _ in range(n_new):
        logits = model(out, return_type="logits")
        out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out
