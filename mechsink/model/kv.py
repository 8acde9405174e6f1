"""Prefix reuse: the keys and values of one run, read again by later runs from a layer.

A later run of positions ``p..`` from some layer on reads positions ``< p`` from a
:class:`PrefixKV` (:func:`mechsink.model.forward.run_from_layer`'s ``prefix=``): in a causal
model, a patch at positions ``>= p`` leaves every earlier position's keys and values unchanged,
so they need not be computed again.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model.hooks import act_name
from mechsink.model.kinds import hf_model_of, is_hooked_transformer, starts_at_layer
from mechsink.model.probes import capabilities


class PrefixKV:
    """Keys and values every attention layer used on one run, recorded by :func:`run_with_kv`,
    in the model's own cache layout: on a TransformerBridge ``[batch, kv_head, pos, d_head]``
    per layer, post-rotary where the model rotates keys (a transformers cache); on a
    HookedTransformer ``[batch, pos, kv_head, d_head]``, before rotary (its ``past_kv_cache``).

    A later run of positions ``p..`` from some layer on reads positions ``< p`` from here
    (:func:`run_from_layer`'s ``prefix=``): in a causal model, a patch at positions ``>= p``
    leaves every earlier position's keys and values unchanged.
    """

    def __init__(self, model: Any, keys: list[Tensor], values: list[Tensor]) -> None:
        self.hooked = is_hooked_transformer(model)
        self.config = None if self.hooked else hf_model_of(model).config
        self.n_layers = int(model.cfg.n_layers)  # keys/values may stop earlier (run_with_kv)
        self.keys, self.values = keys, values

    def rows(self, rows: slice) -> PrefixKV:
        """The keys and values of some rows of the recorded batch (views, not copies)."""
        part = copy.copy(self)
        part.keys = [k[rows] for k in self.keys]
        part.values = [v[rows] for v in self.values]
        return part

    def cache_for(self, first: int, copies: int | Sequence[int]) -> Any:
        """A fresh cache holding positions ``< first``, repeated ``copies`` times along the
        batch (copy-major, like the stacked patch batches); a sequence gives each layer its
        own number of copies (0: the layer is not run; it still holds one copy, because
        transformers reads the cached length off layer 0)."""
        per_layer = [copies] * self.n_layers if isinstance(copies, int) else list(copies)
        # a run recorded up to some block: the layers after it hold a placeholder (0 copies),
        # never read, because the runs that use this cache stop there too
        recorded = len(self.keys)
        per_layer[recorded:] = [0] * (self.n_layers - recorded)
        keys = self.keys + [self.keys[-1]] * (self.n_layers - recorded)
        values = self.values + [self.values[-1]] * (self.n_layers - recorded)
        if self.hooked:
            return [_FrozenKVEntry(k[:, :first].repeat(c, 1, 1, 1),
                                   v[:, :first].repeat(c, 1, 1, 1))
                    for k, v, c in zip(keys, values, per_layer, strict=True)]
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        for layer, (k, v, c) in enumerate(zip(keys, values, per_layer, strict=True)):
            cache.update(k[:, :, :first].repeat(max(c, 1), 1, 1, 1),
                         v[:, :, :first].repeat(max(c, 1), 1, 1, 1), layer)
        return cache


class _FrozenKVEntry:
    """One layer of a HookedTransformer ``past_kv_cache`` that is read, never extended (the
    interface of TransformerLens's frozen cache entry: ``past_keys`` and ``append``)."""

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self.past_keys, self.past_values, self.frozen = keys, values, True

    def append(self, new_keys: Tensor, new_values: Tensor) -> tuple[Tensor, Tensor]:
        return (torch.cat([self.past_keys, new_keys], dim=1),
                torch.cat([self.past_values, new_values], dim=1))


def hooked_kv_names(model: Any) -> list[tuple[str, str]] | None:
    """Per layer, the hooks holding what a HookedTransformer's attention caches (keys before
    rotary, values, both per KV head); None when that is not what its cache would hold."""
    cfg = model.cfg
    if getattr(cfg, "positional_embedding_type", "standard") not in ("standard", "rotary"):
        return None  # shortformer / alibi add position terms outside the cached keys
    if getattr(cfg, "use_split_qkv_input", False) or getattr(cfg, "window_size", None):
        return None
    names = [(act_name("k", layer), act_name("v", layer)) for layer in range(int(cfg.n_layers))]
    hooks = model.hook_dict
    return names if all(k in hooks and v in hooks for k, v in names) else None


def supports_prefix_reuse(model: Any) -> bool:
    """True for models whose attention can extend keys/values from a cache: TransformerLens 4
    bridges whose attention blocks take a transformers cache, and HookedTransformers (their
    ``past_kv_cache``) with standard or rotary positions."""
    if is_hooked_transformer(model):
        return hooked_kv_names(model) is not None
    try:
        hf_model_of(model)
    except BadInputError:
        return False
    if not starts_at_layer(model):
        return False
    if not capabilities(model).start_at_layer:  # a suffix run starts at a later layer
        return False
    blocks = getattr(model, "blocks", None)
    return bool(blocks) and all(hasattr(getattr(b, "attn", None), "_update_kv_cache")
                                for b in blocks)

