"""Next-token loss per sequence: the cost side of every intervention (what an edit does to the
model's predictions)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.measure.forward import Forward, Measurement

LOSS_ROWS = 8  # sequences per cross-entropy call (see next_token_loss)


def next_token_loss(
    tokens: Int[Tensor, "batch pos"], logits: Float[Tensor, "batch pos vocab"],
) -> Float[Tensor, " batch"]:
    """Mean cross-entropy of predicting token ``p + 1`` from position ``p``, per sequence.

    Computed :data:`LOSS_ROWS` sequences at a time: the flattened float32 copy of the logits a
    call makes is ``rows x pos x vocab`` (800 MB for 64 rows of 64 tokens on a 49k vocabulary,
    a third of a stacked readout's time on a CPU); each sequence's value is the same either
    way."""
    target = tokens[:, 1:].to(logits.device)
    out = []
    for lo in range(0, int(logits.shape[0]), LOSS_ROWS):
        part = target[lo:lo + LOSS_ROWS]
        ce = F.cross_entropy(logits[lo:lo + LOSS_ROWS, :-1].float().flatten(0, 1),
                             part.flatten(), reduction="none").view(part.shape)
        out.append(ce.mean(1))
    return torch.cat(out).cpu()


def _read(forward: Forward) -> Tensor:
    assert forward.logits is not None  # asked for below
    return next_token_loss(forward.tokens, forward.logits)


NEXT_TOKEN_LOSS = Measurement((), _read, logits=True)
"""The next-token loss as a :class:`~mechsink.measure.forward.Measurement` (reads the logits)."""
