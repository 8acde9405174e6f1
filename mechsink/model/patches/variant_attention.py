"""Replace a Llama attention module's forward with one whose softmax is a variant's pattern.

Targets: transformers 4.57 to 5.x (``LlamaAttention.forward(hidden_states,
position_embeddings, attention_mask, cache | past_key_values, ...)``, the helpers
``apply_rotary_pos_emb`` and ``repeat_kv`` in ``transformers.models.llama.modeling_llama``;
transformers 5 renamed ``past_key_values`` to ``cache``, both are taken).
Why: transformers picks the softmax inside ``eager_attention_forward``, with no place to put
another one; mechsink's attention variants (:mod:`mechsink.model.variants`) need the plain
transformers model (training, saving, parity checks) to compute what the bridge computes.
The pattern function is kept on the module as ``mechsink_pattern``, where the bridge's patch
(:mod:`mechsink.model.patches.variant_patterns`) finds it after wrapping.
Remove when: transformers lets a module choose its attention weights function.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

TARGETS = {"transformers": ">=4.57,<6"}

PatternFn = Callable[..., Tensor]


def install(attn: nn.Module, pattern: PatternFn) -> None:
    """Make ``attn`` (a Llama-family attention module) weight its values by ``pattern(scores)``
    instead of the softmax of the scaled, masked logits ``scores``."""
    attn.mechsink_pattern = pattern  # a method, not a submodule: found after wrapping
    attn.forward = types.MethodType(_variant_attention_forward, attn)


def pattern_of(attn: nn.Module | None) -> PatternFn | None:
    """The pattern function :func:`install` gave a transformers attention module (else None)."""
    return getattr(attn, "mechsink_pattern", None)


def _variant_attention_forward(self: nn.Module, hidden_states: Tensor,
                               position_embeddings: tuple[Tensor, Tensor] | None = None,
                               attention_mask: Tensor | None = None, cache: Any = None,
                               past_key_values: Any = None, **kwargs: Any
                               ) -> tuple[Tensor, Tensor]:
    """A Llama attention forward whose softmax is the variant's pattern (eager, any mask)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

    cache = cache if cache is not None else past_key_values
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, self.head_dim)
    q = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    k = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    v = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    if cache is not None:
        k, v = cache.update(k, v, self.layer_idx)
    k, v = repeat_kv(k, self.num_key_value_groups), repeat_kv(v, self.num_key_value_groups)
    scores = torch.matmul(q, k.transpose(2, 3)) * self.scaling
    n_q, n_k = scores.shape[-2:]
    causal = torch.ones(n_q, n_k, dtype=torch.bool, device=scores.device).tril(n_k - n_q)
    scores = scores.masked_fill(~causal, float("-inf"))
    if attention_mask is not None:
        mask = attention_mask[..., -n_k:]
        scores = (scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool
                  else scores + mask)
    pattern = self.mechsink_pattern(scores)
    out = torch.matmul(pattern, v).transpose(1, 2).reshape(*input_shape, -1).contiguous()
    return self.o_proj(out), pattern
