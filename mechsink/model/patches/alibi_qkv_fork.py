"""Give MPT's attention the per-head query/key/value inputs TransformerLens declares for it, so
that an edit of ``hook_q_input``/``hook_k_input``/``hook_v_input`` reaches the attention.

Targets: transformer-lens 4.3 (``ALiBiJointQKVAttentionBridge.forward``, the attention bridge
of MPT: it projects the block's normalised input with the split q/k/v linears and never forks
it per head, while the other joint-QKV bridges' ``forward`` calls ``_split_forward_qkv`` when
``use_split_qkv_input`` is set) and transformers 5 (``MptBlock`` unpacks two values from its
attention).
Why: with ``use_split_qkv_input`` on, the hooks ``blocks.<l>.attn.hook_q/k/v_input`` never
fire on MPT, so edge discovery's edits of a receiver's query, key or value input were silently
dropped (every exact edge into a query, key or value scored 0).
Remove when: the bridge forks the input per head itself (the architecture suite's discovery
check passes on MPT without :func:`install_alibi_qkv_fork`).

With the switch off the bridge's own forward runs unchanged. With it on, the forward is the
bridge's own, except that the query, key and value come from ``_split_forward_qkv``: the
residual entering the block (the pre-norm input the block captured) repeated per head, each
copy through the hook and then through the block's first norm, each head projected with its
own slice of the weights (what the other joint-QKV bridges do).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

TARGETS = {"transformer-lens": ">=4.3,<5", "transformers": ">=5,<6"}

_PATCHED = "_mechsink_alibi_qkv_fork"


def _forked(module: Any, forward: Callable[..., Any]) -> Callable[..., Any]:
    """``forward`` of an ALiBi joint-QKV bridge that forks q/k/v per head when asked."""

    def forked_forward(*args: Any, **kwargs: Any) -> Any:
        if not module._is_split_qkv_fork_active():
            return forward(*args, **kwargs)
        # as the bridge's own forward: the hidden states first, the rest by keyword
        hidden = args[0] if args and isinstance(args[0], Tensor) else kwargs.pop("hidden_states")
        q, k, v = module._split_forward_qkv(module.hook_in(hidden))
        out, weights = module._reconstruct_attention(q, k, v, **kwargs)
        return module.hook_out(out), weights

    return forked_forward


def install_alibi_qkv_fork(bridge: Any) -> list[str]:
    """Patch every ALiBi joint-QKV attention of ``bridge`` (MPT's) to fork its input per head
    under ``use_split_qkv_input``; returns the names of the attentions changed. Idempotent;
    changes only the bridge's own modules."""
    from transformer_lens.model_bridge.generalized_components.alibi_joint_qkv_attention import (
        ALiBiJointQKVAttentionBridge,
    )

    changed = []
    for name, module in bridge.named_modules():
        if not isinstance(module, ALiBiJointQKVAttentionBridge) or getattr(module, _PATCHED,
                                                                            False):
            continue
        object.__setattr__(module, "forward", _forked(module, module.forward))
        object.__setattr__(module, _PATCHED, True)
        changed.append(name)
    return changed
