"""Give Bloom's blocks the per-head inputs TransformerLens declares: ``hook_q/k/v_input`` hold
the residual stream (normalised per head afterwards), and ``hook_mlp_in`` fires.

Targets: transformer-lens 4.3 (``BloomBlockBridge.forward`` overrides ``BlockBridge.forward``
without calling ``_maybe_wire_capture_hooks``, the method that captures the residual entering
the block's first norm for the per-head fork and hooks the MLP's input) and transformers 5
(``BloomBlock``: first norm, attention that adds the residual itself, second norm, MLP).
Why: without the capture the attention forks its *normalised* input, so under
``use_split_qkv_input`` an edit of ``hook_q_input`` adds to the norm's output instead of the
residual stream: edge discovery's exact edges into a query, key or value skipped the norm's
recomputation (3e-4..1.6e-3 of the metric off path patching on the architecture suite's Bloom),
and ``hook_mlp_in`` never fired (edges into MLPs read nothing).
Remove when: ``BloomBlockBridge.forward`` wires the capture hooks itself
(``blocks.<l>.attn.hook_q_input`` equals ``blocks.<l>.hook_resid_pre`` per head without
:func:`install_bloom_block_inputs`).

The patched forward is the bridge's own, preceded by the base block's wiring and with the
captured residual released after it, as ``BlockBridge.forward`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TARGETS = {"transformer-lens": ">=4.3,<5", "transformers": ">=5,<6"}

_PATCHED = "_mechsink_bloom_block_inputs"


def _wired(module: Any, forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` of a Bloom block bridge with the base block's input capture around it."""

    def wired_forward(*args: Any, **kwargs: Any) -> Any:
        module._maybe_wire_capture_hooks()
        module._clear_attention_capture()
        try:
            return forward(*args, **kwargs)
        finally:
            module._clear_attention_capture()

    return wired_forward


def install_bloom_block_inputs(bridge: Any) -> list[str]:
    """Patch every Bloom block bridge of ``bridge`` to capture its per-head and MLP inputs;
    returns the names of the blocks changed. Idempotent; changes only the bridge's modules."""
    from transformer_lens.model_bridge.generalized_components.bloom_block import (
        BloomBlockBridge,
    )

    changed = []
    for name, module in bridge.named_modules():
        if not isinstance(module, BloomBlockBridge) or getattr(module, _PATCHED, False):
            continue
        if not all(hasattr(module, m) for m in ("_maybe_wire_capture_hooks",
                                                 "_clear_attention_capture")):
            continue
        object.__setattr__(module, "forward", _wired(module, module.forward))
        object.__setattr__(module, _PATCHED, True)
        changed.append(name)
    return changed
