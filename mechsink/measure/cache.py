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
    """``blocks.{l}.<suffix>`` for all layers, stacked on a new leading layer axis.

    On a :class:`StackedCache` this is the cache's own tensor, not a copy: a measurement must
    not modify it in place (the measurements here are pure functions of the cache)."""
    if isinstance(cache, StackedCache) and (held := cache.stack_of(suffix)) is not None:
        return held
    n = n_layers_in(cache, suffix)
    return torch.stack([cache[hook_name(layer, suffix)] for layer in range(n)])


class StackedCache:
    """A cache that holds each per-block hook stacked over layers, ``[layer, ...]``, once.

    Why: every measurement reads a hook as :func:`stacked` layers, and stacking a cache of
    separate per-layer tensors copies them, once per measurement (the census reads the MLP
    hidden activations, the largest hook, in two measurements). :meth:`of` stacks each hook
    once and frees the per-layer tensors as it goes, so the cache is held once and
    :func:`stacked` costs nothing. ``cache[name]`` is a view of the stack; names that are not
    a complete set of layers ``0..L-1`` of one shape stay as they were."""

    def __init__(self, stacks: dict[str, Tensor], rest: dict[str, Tensor]) -> None:
        self._stacks = stacks
        self._rest = rest

    @classmethod
    def of(cls, tensors: dict[str, Tensor], suffixes: Sequence[str], n_layers: int
           ) -> StackedCache:
        """Restack ``tensors`` (hook name -> tensor; consumed: the caller must hold no other
        reference to the cache it came from, so each layer's tensor is freed once stacked):
        each suffix held at every layer ``0..n_layers-1`` with one shape becomes one tensor.
        Alias keys of a stacked tensor (a bridge's cache can name one activation twice) are
        dropped with it; every other name stays as it was."""
        by_id: dict[int, list[str]] = {}
        for name, value in tensors.items():
            by_id.setdefault(id(value), []).append(name)
        stacks: dict[str, Tensor] = {}
        for suffix in suffixes:
            names = [hook_name(layer, suffix) for layer in range(n_layers)]
            parts = [tensors.get(name) for name in names]
            if n_layers == 0 or any(p is None for p in parts) or \
                    len({(tuple(p.shape), p.dtype, p.device) for p in parts}) != 1:
                continue
            for part in parts:
                for alias in by_id.get(id(part), ()):
                    tensors.pop(alias, None)
            stacks[suffix] = torch.stack(parts)
            del parts
        return cls(stacks, tensors)

    def stack_of(self, suffix: str) -> Tensor | None:
        """The stacked ``[layer, ...]`` tensor of ``suffix``, or None if it is not held so."""
        return self._stacks.get(suffix)

    def keys(self) -> list[str]:
        held = [hook_name(layer, s) for s, t in self._stacks.items() for layer in range(len(t))]
        kept = set(held)
        return held + [k for k in self._rest if k not in kept]

    def __getitem__(self, name: str) -> Tensor:
        m = _BLOCK.match(name)
        if m and m.group(2) in self._stacks and int(m.group(1)) < len(self._stacks[m.group(2)]):
            return self._stacks[m.group(2)][int(m.group(1))]
        return self._rest[name]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in set(self.keys())


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
