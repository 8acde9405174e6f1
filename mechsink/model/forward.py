"""Run part of a model: from a layer, up to a layer, with hooks, reusing a recorded prefix.

The patching engine runs the model many times from the middle. :func:`run_from_layer` runs
blocks ``start..`` on a residual stream and can stop as soon as the hooks a metric needs have
fired; :func:`run_with_kv` records a run's activations and, where the model supports it, its
keys and values (:class:`~mechsink.model.kv.PrefixKV`) for later runs of a suffix. Everything
here is generic over TransformerLens models; the bridge-specific tricks are the patches in
:mod:`mechsink.model.patches`, each guarded.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Sequence
from contextlib import nullcontext
from typing import Any

from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model.hooks import act_name
from mechsink.model.kinds import hf_model_of, is_bridge, is_hooked_transformer, starts_at_layer
from mechsink.model.kv import PrefixKV, hooked_kv_names, supports_prefix_reuse
from mechsink.model.patches.cache_keyword import attention_reads_cache
from mechsink.model.probes import capabilities
from mechsink.model.shortcuts import injected_forward, output_logits_step, start_forward, unembed
from mechsink.model.support import check_supported
from mechsink.model.versions import old_bridge_error

__all__ = ["StopForward", "cache_blocks", "injected_forward", "output_logits_step",
           "run_capturing", "run_from_layer", "run_with_kv", "start_forward", "unembed"]

HookFn = Callable[..., Any]


class StopForward(Exception):
    """Raised from a hook to end a forward pass once everything a caller needs was seen."""


def run_from_layer(
    model: Any,
    resid: Float[Tensor, "batch pos d_model"],
    start: int,
    *,
    fwd_hooks: Sequence[tuple[str, HookFn]] = (),
    stop_after: Collection[str] = (),
    prefix: tuple[PrefixKV, int] | tuple[PrefixKV, int, Sequence[int]] | None = None,
) -> Float[Tensor, "rows pos d_vocab"] | None:
    """Run blocks ``start..`` on ``resid`` (the residual entering block ``start``) with hooks.

    With ``stop_after`` the pass ends as soon as each named hook has fired once (later blocks,
    the final norm and the unembedding are skipped) and None is returned; otherwise the logits.
    With ``prefix=(kv, p)``, ``resid`` holds positions ``p..`` only and attention reads the
    keys and values of positions ``< p`` from ``kv`` (every hook then sees positions ``p..``;
    ``hook_pattern`` is ``[batch, head, query p.., key 0..]``). Hooks are always removed, also
    when a hook or the model raises.
    """
    check_supported(model, "run_from_layer")  # recurrent / hybrid blocks: one line, no forward
    n_layers = int(model.cfg.n_layers)
    if not 0 <= start < n_layers:
        raise BadInputError(f"start layer {start} is outside 0..{n_layers - 1}.")
    pending = set(stop_after)
    hooks = list(fwd_hooks)

    def make_stopper(name: str) -> HookFn:
        def stopper(act: Tensor, hook: Any) -> None:
            pending.discard(name)
            if not pending:
                raise StopForward

        return stopper

    hooks += [(name, make_stopper(name)) for name in sorted(pending)]
    if is_hooked_transformer(model):  # its first block's hooks see ``resid`` itself, and
        resid = resid.clone()         # patches write in place: keep the caller's tensor intact
    kwargs: dict[str, Any] = {}
    reads_cache: Any = nullcontext()
    if prefix is not None and prefix[1] > 0:
        kv, first = prefix[0], prefix[1]
        # a third entry gives the copies entering each layer (a batch that grows on the way)
        copies = prefix[2] if len(prefix) > 2 else resid.shape[0] // kv.keys[0].shape[0]
        if is_hooked_transformer(model):
            kwargs = {"past_kv_cache": kv.cache_for(first, copies)}
        else:
            kwargs = {"cache": kv.cache_for(first, copies), "use_cache": True}
            reads_cache = attention_reads_cache(model)
    if not starts_at_layer(model):
        raise old_bridge_error()
    honoured = capabilities(model).start_at_layer
    if not honoured and prefix is not None and prefix[1] > 0:
        raise BadInputError(
            f"this {type(hf_model_of(model)).__name__} ignores the residual given to "
            "start_at_layer, so a run reusing a recorded prefix cannot be exact: run without "
            "prefix reuse (mechsink.model.supports_prefix_reuse is False for it).")
    try:
        if honoured:
            logits = start_forward(model, resid, start, hooks, reads_cache, **kwargs)
        else:
            logits = injected_forward(model, resid, start, hooks)
    except StopForward:
        return None
    if stop_after:
        raise RuntimeError(f"hooks {sorted(pending)} never fired in a forward from layer {start}.")
    return logits


def run_with_kv(
    model: Any, tokens: Int[Tensor, "batch pos"], names: Collection[str],
    last_layer: int | None = None,
) -> tuple[Float[Tensor, "batch pos d_vocab"] | None, dict[str, Tensor], PrefixKV | None]:
    """One forward: logits, the activations ``names`` and (where supported) every layer's keys
    and values, for later runs that reuse this run's prefix. With ``last_layer`` the forward
    ends after that block (no logits; keys and values of blocks ``0..last_layer`` only, for
    runs that stop there too). Hooks are removed afterwards."""
    wanted = set(names)
    stop = last_layer is not None and last_layer < int(model.cfg.n_layers) - 1
    n_kv = int(model.cfg.n_layers) if not stop else int(last_layer) + 1  # type: ignore[arg-type]
    if not supports_prefix_reuse(model):
        logits, acts = run_capturing(model, tokens, wanted, last_layer if stop else None)
        return logits, acts, None
    if is_hooked_transformer(model):
        kv_names = hooked_kv_names(model)
        assert kv_names is not None
        kv_names = kv_names[:n_kv]
        every = wanted | {n for pair in kv_names for n in pair}
        logits, acts = run_capturing(model, tokens, every, last_layer if stop else None)
        kv = PrefixKV(model, [acts[k] for k, _ in kv_names], [acts[v] for _, v in kv_names])
        return logits, {n: a for n, a in acts.items() if n in wanted}, kv
    from transformers import DynamicCache

    record = DynamicCache(config=hf_model_of(model).config)
    with attention_reads_cache(model):
        logits, acts = run_capturing(model, tokens, wanted, last_layer if stop else None,
                                      cache=record, use_cache=True)
    layers = record.layers[:n_kv]
    if len(layers) != n_kv or any(
        x.keys is None or x.keys.shape[2] != tokens.shape[1] for x in layers
    ):  # this model did not record every position (or keeps a window only): no reuse
        return logits, acts, None
    kv = PrefixKV(model, [x.keys for x in layers], [x.values for x in layers])
    return logits, acts, kv


def run_capturing(
    model: Any, tokens: Tensor, names: set[str], last_layer: int | None, **kwargs: Any
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """A forward keeping the activations ``names``; with ``last_layer``, ending after that
    block's output (logits None). Hooks are removed afterwards, also on an error."""
    if last_layer is None:
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, **kwargs)
        return logits, dict(cache.cache_dict)
    acts: dict[str, Tensor] = {}

    def keep_as(name: str) -> HookFn:  # keyed by the name asked for (hooks have aliases)
        def keep(act: Tensor, hook: Any) -> None:
            acts[name] = act.detach()

        return keep

    def stopper(act: Tensor, hook: Any) -> None:
        raise StopForward

    hooks = [(n, keep_as(n)) for n in sorted(names)] + [
        (act_name("resid_post", last_layer), stopper)]
    try:
        with model.hooks(fwd_hooks=hooks):
            model(tokens, **kwargs)
    except StopForward:
        pass
    missing = sorted(names - set(acts))
    if missing:
        raise BadInputError(f"hooks {missing} did not fire before block {last_layer} ended.")
    return None, acts


#: models whose stopped run left a hook out (a bridge without ``ln_final.hook_in`` firing
#: after the last block): their blocks-only runs go the full way
_NO_EARLY_STOP: weakref.WeakSet[Any] = weakref.WeakSet()


def cache_blocks(model: Any, tokens: Tensor, names: Sequence[str]) -> dict[str, Tensor]:
    """``run_with_cache`` of the per-block hooks ``names`` that ends after the last block: no
    final norm and no unembedding, which is most of a forward where the vocabulary is large
    (Gemma 3 270M: 168M of its 270M parameters; the run 2.4x faster on 8 x 64 tokens). Where
    the model cannot stop there, the full forward (the same activations)."""
    wanted = set(names)
    full = lambda: dict(model.run_with_cache(  # noqa: E731
        tokens, names_filter=lambda n: n in wanted, return_type=None)[1].cache_dict)
    if model in _NO_EARLY_STOP:
        return full()
    if is_hooked_transformer(model):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in wanted,
                                        stop_at_layer=int(model.cfg.n_layers))
        return dict(cache.cache_dict)
    stop_at = "ln_final.hook_in"
    if not is_bridge(model) or stop_at not in getattr(model, "hook_dict", {}):
        _NO_EARLY_STOP.add(model)
        return full()
    from transformer_lens.model_bridge.exceptions import StopAtLayerException

    def stop(act: Tensor, hook: Any) -> None:  # the bridge's run_with_cache ends here
        raise StopAtLayerException(act)

    with model.hooks(fwd_hooks=[(stop_at, stop)]):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in wanted,
                                        return_type=None)
    got = dict(cache.cache_dict)
    if wanted - set(got):  # a hook fires after the final norm's input: run the whole way
        _NO_EARLY_STOP.add(model)
        return full()
    return got
