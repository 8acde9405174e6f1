"""Rotated queries and keys back in the model's dtype, as transformers casts them.

Targets: transformer-lens 4.3 (``PositionEmbeddingsAttentionBridge`` rotates queries and keys
with Llama's ``apply_rotary_pos_emb``, which keeps the dtype of ``cos``/``sin``) and
transformers 5 (OLMo's, OLMo 2's, OLMo 3's and FlexOlmo's rotary embeddings return float32
``cos``/``sin``; their own ``apply_rotary_pos_emb`` rotates in float32 and casts the result
back to the query's dtype).
Why: loaded in bfloat16 or float16, those models' rotated queries and keys stayed float32 in
the bridge, and its attention failed ("expected m1 and m2 to have the same dtype") at the
pattern-value product: no forward ran at all.
Remove when: the bridge casts the rotated vectors back itself (the architecture suite's bf16
column then passes for the OLMo family without :func:`install_rotary_dtype`).

The cast happens inside ``hook_rot_q`` / ``hook_rot_k`` (their identity forward replaced by a
cast to the value projection's dtype), so a hook on them sees the vectors the attention uses;
on a model whose rotated vectors already have that dtype it returns them unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

TARGETS = {"transformer-lens": ">=4.3,<5", "transformers": ">=5,<6"}

_WRAPPED = "_mechsink_rotary_dtype"


def _cast_to(dtype: torch.dtype) -> Callable[[Tensor], Tensor]:
    def forward(x: Tensor) -> Tensor:
        return x if x.dtype == dtype or not x.is_floating_point() else x.to(dtype)

    return forward


def _value_dtype(attn: Any) -> torch.dtype | None:
    v = getattr(attn, "v", None)
    weight = getattr(getattr(v, "original_component", None), "weight", None)
    if isinstance(weight, Tensor) and weight.dtype.is_floating_point:
        return weight.dtype
    return None


def install_rotary_dtype(bridge: Any) -> list[str]:
    """Make every reconstructed rotary attention of ``bridge`` whose weights are not float32
    cast its rotated queries and keys to the weights' dtype (see the module doc); returns the
    names of the attentions changed (idempotent; none on a float32 model)."""
    from transformer_lens.model_bridge.generalized_components.position_embeddings_attention import (  # noqa: E501
        PositionEmbeddingsAttentionBridge,
    )

    changed = []
    for name, module in bridge.named_modules():
        if not isinstance(module, PositionEmbeddingsAttentionBridge) or \
                getattr(module, _WRAPPED, False):
            continue
        dtype = _value_dtype(module)
        hooks = [getattr(module, h, None) for h in ("hook_rot_q", "hook_rot_k")]
        if dtype is None or dtype == torch.float32 or any(h is None for h in hooks):
            continue
        for hook in hooks:
            object.__setattr__(hook, "forward", _cast_to(dtype))
        object.__setattr__(module, _WRAPPED, True)
        changed.append(name.replace("._original_component", ""))
    return changed
