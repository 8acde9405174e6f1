"""Make the attention hooks TransformerLens declares fire where its bridge never calls them,
with the tensors the attention really uses, so that reading them reads the computation and
editing them changes it.

Targets: transformer-lens 4.3 (``JointQKVPositionEmbeddingsAttentionBridge._apply_rotary_pos_emb``:
the fused-QKV rotary bridge of GPT-NeoX, Falcon and Phi-3 rotates without calling
``hook_rot_q/k``; the plain ``AttentionBridge`` of GPT-J, OPT, XGLM, Llama 4, NanoChat, Laguna,
Afmoe and ModernBERT-decoder runs the transformers module and fires ``hook_pattern`` and
``hook_attn_scores`` afterwards on the returned weights, where an edit is discarded with a
warning and ``hook_attn_scores`` holds the pattern, not the scores) and transformers 5 (each
modeling module's ``eager_attention_forward(module, query, key, value, ...)``, called with the
rotated query and key ``[batch, heads, pos, d_head]``, keys per KV head, which computes the
scores and takes ``nn.functional.softmax`` of them).
Why: a cache, a patch or a measurement that names these hooks (the census's key-bias cosine,
``attend_only_to_self``, pattern patching) found nothing, read the vectors before rotation, or
edited a copy the model had already used.
Remove when: the bridges call these hooks inside their computation themselves (the
architecture suite's ``test_qkv.py`` and the interventions' mask edit then pass without
:func:`install_attention_hooks`).

All hooks see TransformerLens's layouts (``hook_rot_q/k``: ``[batch, pos, head, d_head]``
through the hook points' own conversion; scores and pattern ``[batch, head, query, key]``); a
returned tensor replaces the value in the computation. On the plain bridge the scores are
transformers' (its causal mask is a large negative number, not ``-inf``).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

TARGETS = {"transformer-lens": ">=4.3,<5", "transformers": ">=5,<6"}

#: transformers attention module -> the bridge attention that wraps it (for the hooks)
_OWNERS: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()
_WRAPPED = "_mechsink_attention_hooks"


def _fire_after(module: nn.Module, rotate: Callable[..., tuple[Tensor, Tensor]]
                ) -> Callable[..., tuple[Tensor, Tensor]]:
    """The bridge's own rotation, followed by its rotary hooks."""

    def rotated(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        q, k = rotate(q, k, cos, sin)
        return module.hook_rot_q(q), module.hook_rot_k(k)

    return rotated


def _hooked_softmax(owner: nn.Module, n_keys: int, fired: list[bool]) -> Callable[..., Tensor]:
    """``nn.functional.softmax`` whose first call on ``[batch, head, query, n_keys]`` scores
    runs them through the owner's ``hook_attn_scores`` and its output through ``hook_pattern``
    (a learned sink column, as in GPT-OSS, changes the width: left alone)."""
    softmax = torch.nn.functional.softmax

    def hooked(x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if fired or x.dim() != 4 or x.shape[-1] != n_keys:
            return softmax(x, *args, **kwargs)
        fired.append(True)
        return owner.hook_pattern(softmax(owner.hook_attn_scores(x), *args, **kwargs))

    return hooked


def _hooked_eager(eager: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' eager attention with the owning bridge's hooks inside: rotary hooks on
    its query and key, score and pattern hooks around its softmax (a forward without a cache
    only: with one, the keys include earlier positions). The weights are not returned when the
    hooks fired inside, so the bridge does not fire ``hook_pattern`` a second time."""

    def eager_attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor,
                                *args: Any, **kwargs: Any) -> Any:
        owner = _OWNERS.get(module)
        if owner is None or query.shape[-2] != key.shape[-2]:
            return eager(module, query, key, value, *args, **kwargs)
        if hasattr(owner, "hook_rot_q") and hasattr(owner, "hook_rot_k"):
            query, key = owner.hook_rot_q(query), owner.hook_rot_k(key)
        fired: list[bool] = []
        real = torch.nn.functional.softmax
        torch.nn.functional.softmax = _hooked_softmax(owner, key.shape[-2], fired)
        try:
            out = eager(module, query, key, value, *args, **kwargs)
        finally:
            torch.nn.functional.softmax = real
        if fired and isinstance(out, tuple) and len(out) == 2:
            return out[0], None
        return out

    setattr(eager_attention_forward, _WRAPPED, eager)
    return eager_attention_forward


def install_attention_hooks(bridge: Any) -> list[str]:
    """Make every attention of ``bridge`` call its declared hooks inside its computation (see
    the module doc); returns the names of the attentions changed.

    Idempotent. Changes the bridge's own modules and (once per transformers modeling module)
    wraps that module's ``eager_attention_forward``: the wrapper does nothing for an attention
    no bridge owns."""
    from transformer_lens.model_bridge.generalized_components.joint_qkv_position_embeddings_attention import (  # noqa: E501
        JointQKVPositionEmbeddingsAttentionBridge,
    )

    changed = []
    for name, module in bridge.named_modules():
        if getattr(module, _WRAPPED, False):
            continue
        if isinstance(module, JointQKVPositionEmbeddingsAttentionBridge):
            if not (hasattr(module, "hook_rot_q") and hasattr(module, "hook_rot_k")):
                continue
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
