"""Make the bridge's declared ``attn.hook_rot_q`` / ``attn.hook_rot_k`` fire, with the queries
and keys the attention score is really made of (after the rotary embedding), and make edits
to them reach the output.

Targets: transformer-lens 4.3 (``JointQKVPositionEmbeddingsAttentionBridge._apply_rotary_pos_emb``,
the fused-QKV rotary bridge of GPT-NeoX, Falcon and Phi-3, rotates without calling its rotary
hooks; ``AttentionBridge`` on GPT-J, Llama 4, NanoChat, Laguna, Afmoe, ModernBERT-decoder runs
the transformers module, which rotates inside) and transformers 5 (each modeling module's
``eager_attention_forward(module, query, key, value, ...)``, called with the rotated query and
key ``[batch, heads, pos, d_head]``, keys per KV head).
Why: TransformerLens declares both hooks on every rotary model, so a cache, a patch or a
measurement (the census's key-bias cosine) that names them either found nothing or, reading
``hook_q/k`` instead, read the vectors before rotation.
Remove when: the bridges call ``hook_rot_q/k`` themselves (the architecture suite's
``test_rotary_hooks_equal_transformers`` then passes without :func:`fire_rotary_hooks`).

Both hooks see TransformerLens's layout ``[batch, pos, head, d_head]`` (the hook points'
own ``TransposeRotaryHeads`` conversion); a returned tensor replaces the rotated vectors.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

TARGETS = {"transformer-lens": ">=4.3,<5", "transformers": ">=5,<6"}

#: transformers attention module -> the bridge attention that wraps it (for the hooks)
_OWNERS: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()
_WRAPPED = "_mechsink_rotary_hooks"


def _has_rotary_hooks(module: nn.Module) -> bool:
    return hasattr(module, "hook_rot_q") and hasattr(module, "hook_rot_k")


def _fire_after(module: nn.Module, rotate: Callable[..., tuple[Tensor, Tensor]]
                ) -> Callable[..., tuple[Tensor, Tensor]]:
    """The bridge's own rotation, followed by its rotary hooks."""

    def rotated(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        q, k = rotate(q, k, cos, sin)
        return module.hook_rot_q(q), module.hook_rot_k(k)

    return rotated


def _hooked_eager(eager: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' eager attention, with the owning bridge's rotary hooks on its query and
    key (a forward without a cache only: with one, the keys include earlier positions)."""

    def eager_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                                *args: Any, **kwargs: Any) -> Any:
        owner = _OWNERS.get(module)
        if owner is not None and query.shape[-2] == key.shape[-2]:
            query, key = owner.hook_rot_q(query), owner.hook_rot_k(key)
        return eager(module, query, key, value, *args, **kwargs)

    setattr(eager_attention_forward, _WRAPPED, eager)
    return eager_attention_forward


def fire_rotary_hooks(bridge: Any) -> list[str]:
    """Install the rotary hooks on every attention of ``bridge`` that declares them but whose
    forward never calls them; returns the names of the attentions changed.

    Idempotent. Changes the bridge's own modules, and (once per transformers modeling module)
    wraps that module's ``eager_attention_forward``: the wrapper does nothing for an attention
    no bridge owns."""
    from transformer_lens.model_bridge.generalized_components.joint_qkv_position_embeddings_attention import (  # noqa: E501
        JointQKVPositionEmbeddingsAttentionBridge,
    )

    changed = []
    for name, module in bridge.named_modules():
        if not _has_rotary_hooks(module) or getattr(module, _WRAPPED, False):
            continue
        if isinstance(module, JointQKVPositionEmbeddingsAttentionBridge):
            module._apply_rotary_pos_emb = _fire_after(module, module._apply_rotary_pos_emb)
        elif _delegates(module):
            hf = module.original_component
            modeling = sys.modules.get(type(hf).__module__)
            eager = getattr(modeling, "eager_attention_forward", None)
            if eager is None:
                continue
            if not hasattr(eager, _WRAPPED):
                modeling.eager_attention_forward = _hooked_eager(eager)
            _OWNERS[hf] = module
        else:
            continue
        object.__setattr__(module, _WRAPPED, True)
        changed.append(name.replace("._original_component", ""))
    return changed


def _delegates(module: nn.Module) -> bool:
    """An attention bridge that runs the transformers module's own forward (TransformerLens's
    plain ``AttentionBridge``), not a reconstruction of it."""
    from transformer_lens.model_bridge.generalized_components.attention import AttentionBridge

    return type(module) is AttentionBridge and \
        getattr(module, "original_component", None) is not None
