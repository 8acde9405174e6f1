"""Reading per-layer activations out of a cache (a mapping of standard hook name -> tensor).

Measurements name hooks by their per-block suffix (``"hook_resid_post"``, ``"attn.hook_pattern"``);
these helpers turn that into ``blocks.{l}.<suffix>`` and stack the layers, so every measurement
works on any cache with TransformerLens hook names (an ``ActivationCache`` or a plain dict).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model import act_name

_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


@runtime_checkable
class CacheLike(Protocol):
    """What a measurement reads: a TransformerLens ``ActivationCache`` or a plain dict."""

    def keys(self) -> Iterable[str]: ...

    def __getitem__(self, name: str) -> Tensor: ...


def hook_name(layer: int, suffix: str) -> str:
    """The full hook name of a per-block hook (``suffix`` relative to the block)."""
    return act_name(suffix, layer)


def hook_names(n_layers: int, suffixes: Iterable[str]) -> list[str]:
    """Every ``blocks.{l}.<suffix>`` for ``l < n_layers``: a names_filter for run_with_cache."""
    return [hook_name(layer, s) for s in suffixes for layer in range(n_layers)]


def n_layers_in(cache: CacheLike, suffix: str) -> int:
    """How many layers hold ``suffix``; they must be exactly layers 0..L-1."""
    layers = sorted(int(m.group(1)) for k in cache.keys()
                    if (m := _BLOCK.match(k)) and m.group(2) == suffix)
    if not layers:
        raise BadInputError(
            f"the cache holds no 'blocks.<l>.{suffix}': cache that hook "
            f"(names_filter) before measuring."
        )
    if layers != list(range(len(layers))):
        raise BadInputError(
            f"the cache holds '{suffix}' for layers {layers}, not for every layer from 0: "
            "cache all layers."
        )
    return len(layers)


def stacked(cache: CacheLike, suffix: str) -> Tensor:
    """``blocks.{l}.<suffix>`` for all layers, stacked on a new leading layer axis."""
    n = n_layers_in(cache, suffix)
    return torch.stack([cache[hook_name(layer, suffix)] for layer in range(n)])


def rounded(x: float | int | Tensor | None, digits: int = 6) -> float | None:
    """A float rounded to ``digits`` significant digits for JSON (NaN/inf become None)."""
    if x is None:
        return None
    x = float(x)
    if not math.isfinite(x):
        return None
    return float(f"{x:.{digits}g}")


def rounded_list(t: Tensor, digits: int = 6) -> list:
    """A tensor as nested lists of rounded floats."""
    if t.ndim == 0:
        return rounded(t.item(), digits)  # type: ignore[return-value]
    return [rounded_list(row, digits) for row in t] if t.ndim > 1 else \
        [rounded(v, digits) for v in t.tolist()]


def frame(columns: dict[str, Any]) -> Any:
    """A pandas DataFrame from equal-length columns (lists or 1-D tensors)."""
    import pandas as pd

    return pd.DataFrame({k: v.tolist() if isinstance(v, Tensor) else list(v)
                         for k, v in columns.items()})


def grid_frame(index: Sequence[str], values: dict[str, Tensor]) -> Any:
    """One row per cell of equally shaped tensors (``index`` names their axes), e.g. one row
    per (layer, head) with a column per measurement."""
    first = next(iter(values.values()))
    cells = torch.cartesian_prod(*[torch.arange(n) for n in first.shape]).reshape(
        -1, first.dim())
    cols: dict[str, Any] = {name: cells[:, i] for i, name in enumerate(index)}
    cols.update({k: v.detach().double().flatten().cpu() for k, v in values.items()})
    return frame(cols)
