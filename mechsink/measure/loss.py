"""Next-token loss per sequence: the cost side of every intervention (what an edit does to the
model's predictions)."""

from __future__ import annotations

import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.measure.forward import Forward, Measurement


def next_token_loss(
    tokens: Int[Tensor, "batch pos"], logits: Float[Tensor, "batch pos vocab"],
) -> Float[Tensor, " batch"]:
    """Mean cross-entropy of predicting token ``p + 1`` from position ``p``, per sequence."""
    target = tokens[:, 1:].to(logits.device)
    ce = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), target.flatten(),
                         reduction="none").view(target.shape)
    return ce.mean(1).cpu()


def _read(forward: Forward) -> Tensor:
    assert forward.logits is not None  # asked for below
    return next_token_loss(forward.tokens, forward.logits)


NEXT_TOKEN_LOSS = Measurement((), _read, logits=True)
"""The next-token loss as a :class:`~mechsink.measure.forward.Measurement` (reads the logits)."""
