"""Blocks with no hooks run as plain transformers layers (TransformerLens 4's bridge).

Targets: TransformerLens 4.x ``TransformerBridge`` (``BlockBridge.forward`` calling its
``original_component``, a transformers decoder layer whose attention, MLP, norms and linear
layers are bridge components wrapping the original modules), transformers 4.5x / 5.x.

A bridge block call goes through a wrapper per component (attention, each projection, the
MLP, each norm), each running its hook points and bookkeeping even when no hook is set.
Inside :func:`fast_blocks`, a block none of whose hook points has a hook (and which is not
asked to read keys/values already in a cache) runs as a *plain* copy of its transformers layer:
the same modules with every bridge wrapper replaced by the module it wraps, sharing the
parameters (no weights are copied). The block's own entry steps (a residual injected by
``start_at_layer``, ``stop_at_layer``) still run, and its output goes through its (empty)
``hook_out``, so callers see the same tuple or tensor. ``benchmarks/blocks.py`` measures the
per-call cost against transformers' own layer with and without it; tests compare the outputs.

Why: the per-component wrappers cost 1.76x transformers' own layer per call at 1 x 1 token
(SmolLM2 block 3), time spent on hook points that hold no hook.

Remove when: TransformerLens's bridge skips its wrappers' bookkeeping when no hook is set.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

TARGETS = {"transformer-lens": ">=4.3,<5", "transformers": ">=5,<6"}
_PLAIN = "_mechsink_plain_layer"
_DICTS = "_mechsink_module_dicts"


def _is_wrapper(module: nn.Module) -> bool:
    """A bridge component wrapping an original module (TransformerLens's
    ``GeneralizedComponent``: it holds ``original_component``)."""
    return type(module).__module__.startswith("transformer_lens.model_bridge") and isinstance(
        getattr(module, "original_component", None), nn.Module)


def plain_copy(module: nn.Module) -> nn.Module:
    """``module`` with every bridge wrapper below it replaced by the module it wraps (a shallow
    copy: parameters and buffers are shared)."""
    if _is_wrapper(module):
        return plain_copy(module.original_component)
    if not any(True for _ in module.children()):
        return module
    new = copy.copy(module)
    new._modules = {k: (None if v is None else plain_copy(v)) for k, v in module._modules.items()}
    return new


def hooks_empty(block: nn.Module) -> bool:
    """No TransformerLens module in ``block`` (hook points, bridge wrappers) has a forward or
    backward hook, besides the block's own capture hooks (``BlockBridge._capture_hook_handles``:
    they hand the residual to per-head forks and ``hook_mlp_in``, which an empty block does
    not use). Hooks on transformers' own modules (its output recorders) are shared by the
    plain copy and run either way."""
    dicts = block.__dict__.get(_DICTS)
    if dicts is None:  # the modules' own attribute dicts, listed once per block
        dicts = [m.__dict__ for m in block.modules()
                 if type(m).__module__.startswith("transformer_lens")]
        block.__dict__[_DICTS] = dicts
    own = {h.id for h in block.__dict__.get("_capture_hook_handles", ())}
    for d in dicts:
        if d["_forward_hooks"] or d["_backward_hooks"] or d.get("_backward_pre_hooks"):
            return False
        if any(k not in own for k in d["_forward_pre_hooks"]):
            return False
    return True


_CACHE_KEYS = ("past_key_values", "past_key_value", "cache")


def _cache_read(kwargs: dict[str, Any], layer_idx: int | None) -> bool:
    """The call reads keys/values already in a cache (prefix reuse: the bridge's attention
    is patched for that, so such calls keep the bridge's path). A fresh cache is only
    written, which the plain layer does as transformers does."""
    for key in _CACHE_KEYS:
        cache = kwargs.get(key)
        if cache is None:
            continue
        length = getattr(cache, "get_seq_length", None)
        if length is None or layer_idx is None or int(length(layer_idx)) > 0:
            return True
    return False


def _splits_heads(model: Any) -> bool:
    """Graph-mode switches (per-head inputs and results) change what the wrappers compute."""
    cfg = model.cfg
    return any(bool(getattr(cfg, f, False)) for f in (
        "use_split_qkv_input", "use_attn_result", "use_hook_mlp_in", "use_attn_in"))


def _fast_forward(model: Any, block: nn.Module, slow: Any) -> Any:
    def forward(*args: Any, **kwargs: Any) -> Any:
        plain = block.__dict__.get(_PLAIN)
        if plain is None:
            plain = plain_copy(block.original_component)
            block.__dict__[_PLAIN] = plain
        attn = getattr(plain, "self_attn", None)
        if _splits_heads(model) or not hooks_empty(block) or _cache_read(
                kwargs, getattr(attn, "layer_idx", None)):
            return slow(*args, **kwargs)
        args, kwargs = block._maybe_inject_start_residual(args, kwargs)
        block._check_stop_at_layer(*args, **kwargs)
        kw = block._filter_kwargs_for_forward(kwargs, len(args))
        out = plain(*args, **kw)
        tuple_out = block._is_standalone_hidden_state_call(args, kw)
        return block._apply_output_hook(out, force_tuple_for_bare_tensor=tuple_out)
    return forward


def supported(model: Any) -> bool:
    """Whether ``model``'s blocks are bridge blocks this patch knows (``BlockBridge`` with the
    entry steps it calls)."""
    blocks = getattr(model, "blocks", None)
    if not blocks:
        return False
    need = ("_maybe_inject_start_residual", "_check_stop_at_layer", "_filter_kwargs_for_forward",
            "_is_standalone_hidden_state_call", "_apply_output_hook", "original_component")
    return all(all(hasattr(b, n) for n in need) for b in blocks)


@contextmanager
def fast_blocks(model: Any) -> Iterator[bool]:
    """Blocks with no hooks run as plain transformers layers inside the block; yields whether
    the model's blocks are supported (otherwise nothing changes). Restored on exit."""
    if not supported(model):
        yield False
        return
    saved = []
    try:
        for block in model.blocks:  # set on the block itself (bridge components pass
            # unknown attributes on to the module they wrap)
            before = block.__dict__.get("forward")
            saved.append((block, before))
            slow = before if before is not None else type(block).forward.__get__(block)
            object.__setattr__(block, "forward", _fast_forward(model, block, slow))
        yield True
    finally:
        for block, before in saved:
            if before is None:
                block.__dict__.pop("forward", None)
            else:
                object.__setattr__(block, "forward", before)
