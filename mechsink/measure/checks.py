"""Argument checks shared by the measurements and the interventions built on them: each raises a
:class:`~mechsink.errors.BadInputError` before any work."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mechsink.errors import BadInputError


def check_channels(model: Any, channels: Sequence[int]) -> list[int]:
    """``channels`` as ints, checked to be a non-empty list of residual channels."""
    d = int(model.cfg.d_model)
    out = [int(c) for c in channels]
    if not out or not all(0 <= c < d for c in out):
        raise BadInputError(f"channels {list(channels)} must be a non-empty list in 0..{d - 1}.")
    return out


def check_layers(model: Any, layers: Sequence[int]) -> list[int]:
    """``layers`` sorted and without repeats, checked to be a non-empty list of blocks."""
    n = int(model.cfg.n_layers)
    out = sorted({int(x) for x in layers})
    if not out or not all(0 <= x < n for x in out):
        raise BadInputError(f"layers {list(layers)} must be a non-empty list in 0..{n - 1}.")
    return out


def check_batch_size(batch_size: int | None) -> None:
    """Raise unless ``batch_size`` is None (one forward) or a positive integer."""
    if batch_size is None:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise BadInputError(f"batch_size must be a positive integer, got {batch_size!r}.")
