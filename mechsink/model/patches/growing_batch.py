"""Let a hook grow the batch in the middle of a forward pass.

Targets: transformers 4.57 to 5.x (the decoder builds one 4-D attention mask,
``[batch, 1, query, key]``, for the batch it was called with, and hands it to every attention
module as ``attention_mask=``) under a transformer-lens 4.3 bridge; on a HookedTransformer the
pre-hook finds no such keyword and does nothing.
Why: the patching engine's staircase adds copies at later blocks, so a block can see more rows
than the mask was built for. mechsink never pads, so every row's causal mask is the same, and
the first row's mask serves all rows.
Remove when: the engine stops growing the batch mid-forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor, nn

TARGETS = {"transformers": ">=4.57,<6", "transformer-lens": ">=4.3,<5"}


@contextmanager
def masks_follow_batch(model: Any) -> Iterator[None]:
    """Let a hook grow the batch mid-forward (the patching engine's staircase adds copies at
    later blocks): an attention mask built for the first rows is cut to one row, which every
    row shares (mechsink never pads, so each row's causal mask is the same)."""

    def one_row(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        mask = kwargs.get("attention_mask")
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if (isinstance(mask, Tensor) and mask.ndim == 4 and isinstance(hidden, Tensor)
                and mask.shape[0] not in (1, hidden.shape[0])):
            kwargs = {**kwargs, "attention_mask": mask[:1]}
        return args, kwargs

    handles = [b.attn.register_forward_pre_hook(one_row, with_kwargs=True)
               for b in model.blocks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
