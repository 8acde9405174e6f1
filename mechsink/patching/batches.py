"""Padded batches: prompts of unequal length in one tensor, for per-prompt metrics.

Prompts are padded on the right: under causal attention a real token never reads the pads
after it, so every real position of a padded row equals the unpadded prompt's run, and a
metric reads each prompt at its last real token (``LogitDiff(..., attention_mask=mask)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model import to_tokens
from mechsink.model.tokens import tokenizer_of


def pad_prompts(
    model: Any, prompts: Sequence[str], *, prepend_bos: bool
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Token ids of ``prompts`` right-padded to the longest, and the attention mask (1 on real
    tokens). The pad id is the tokenizer's pad token, else its EOS, else its BOS."""
    if isinstance(prompts, str) or not prompts:
        raise BadInputError("pad_prompts takes a non-empty list of prompts (strings).")
    rows = [to_tokens(model, p, prepend_bos=prepend_bos)[0] for p in prompts]
    tok = tokenizer_of(model)
    pad = next((t for t in (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id)
                if t is not None), None)
    if pad is None:
        raise BadInputError("this tokenizer has no pad, EOS or BOS token to pad with.")
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), int(pad), dtype=torch.long, device=rows[0].device)
    mask = torch.zeros((len(rows), width), dtype=torch.long, device=rows[0].device)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = r
        mask[i, :len(r)] = 1
    return tokens, mask
