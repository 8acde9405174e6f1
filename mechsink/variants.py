"""Architecture edits that stay hookable: head-wise RMSNorm (the structural-origin paper's fix).

Head-wise RMSNorm (Li et al. 2026, "The Structural Origin of Attention Sink") normalises each
head's value-aggregation output ``z`` (the attention-weighted sum of values, before ``W_O``) to
unit RMS and multiplies it by a learnable per-head gain. Position 0 (whose ``z`` is its own
value vector) and later positions (whose ``z`` averages many values) then have equal scale.

It is applied by replacing each attention block's output projection with
:class:`HeadwiseRMSNormOut`, which holds the original projection. In a TransformerBridge,
``blocks.{l}.attn.hook_z`` still sees ``z`` *before* the norm (it is the input of the replaced
projection); the normalised, gained ``z`` is what enters ``W_O``.
"""

from __future__ import annotations

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

HEADWISE_RMSNORM = "headwise_rmsnorm"


class HeadwiseRMSNormOut(nn.Module):
    """RMS-normalise each head's slice of the input, scale by a gain, then project."""

    def __init__(self, proj: nn.Module, n_heads: int, d_head: int, eps: float = 1e-6):
        super().__init__()
        self.proj = proj
        self.n_heads, self.d_head, self.eps = n_heads, d_head, eps
        self.gain = nn.Parameter(torch.ones(n_heads, d_head))

    def normalise(
        self, z: Float[Tensor, "*batch pos heads_x_dhead"]
    ) -> Float[Tensor, "*batch pos heads d_head"]:
        """Each head's ``z`` divided by its RMS (before the gain)."""
        heads = z.unflatten(-1, (self.n_heads, self.d_head))
        return heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, z: Tensor) -> Tensor:
        return self.proj((self.normalise(z) * self.gain).flatten(-2))


def _attention_blocks(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(attention module, name of its output projection) for each layer of a GPT-2 / Llama."""
    if hasattr(model, "transformer") and hasattr(model.transformer, "h"):
        return [(block.attn, "c_proj") for block in model.transformer.h]
    if hasattr(model, "model") and hasattr(model.model, "layers"):
        return [(layer.self_attn, "o_proj") for layer in model.model.layers]
    raise NotImplementedError(
        f"head-wise RMSNorm knows GPT-2 and Llama-style models, not {type(model).__name__}."
    )


def apply_headwise_rmsnorm(model: nn.Module) -> nn.Module:
    """Insert head-wise RMSNorm before every output projection of a transformers model (in place).

    The gains start at one, so the model's function changes (z is rescaled) but nothing else.
    """
    config = model.config
    n_heads = config.num_attention_heads
    d_head = getattr(config, "head_dim", None) or config.hidden_size // n_heads
    for attn, name in _attention_blocks(model):
        proj = getattr(attn, name)
        if isinstance(proj, HeadwiseRMSNormOut):
            continue
        setattr(attn, name, HeadwiseRMSNormOut(proj, n_heads, d_head))
    variants = set(getattr(config, "mechsink_variants", []) or [])
    config.mechsink_variants = sorted(variants | {HEADWISE_RMSNORM})
    return model


def variants_of(config: Any) -> list[str]:
    """The mechsink variants recorded in a transformers config (empty for a plain model)."""
    return list(getattr(config, "mechsink_variants", []) or [])


def apply_variants(model: nn.Module, variants: list[str]) -> nn.Module:
    """Re-apply recorded variants (used when an organism is loaded)."""
    for variant in variants:
        if variant != HEADWISE_RMSNORM:
            raise NotImplementedError(f"unknown mechsink variant {variant!r}")
        apply_headwise_rmsnorm(model)
    return model
