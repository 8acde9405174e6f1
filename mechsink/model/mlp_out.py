"""What happens to an MLP's output between its down projection and the residual stream.

Gemma 2/3 and OLMo 2 normalise the MLP's output (``post_feedforward_layernorm``, TransformerLens's
``ln2_post``) before it joins the residual stream: ``hook_mlp_out = norm(post @ W_out + b_out)``.
A share of the down projection's output is then not a share of what reaches the residual stream
(on Gemma-3-270M a 0.07 write into a massive channel becomes ~2e5), so the super-neuron sets run
each candidate write through the model's own norm module, given here per block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

PostNorm = Callable[[Tensor], Tensor]  # [..., d_model] -> [..., d_model]


def _plain(module: Any) -> Any:
    """The transformers module under a bridge component (calling it fires no hook)."""
    return getattr(module, "_original_component", None) or module


def post_mlp_norms(model: Any) -> tuple[PostNorm | None, ...]:
    """Per block, the norm applied to the MLP's output before the residual add (the model's own
    module, e.g. ``Gemma3RMSNorm``), or None where the block adds the MLP's output as it is."""
    out: list[PostNorm | None] = []
    for block in model.blocks:
        norm = getattr(block, "ln2_post", None)
        out.append(None if norm is None else _plain(norm))
    return tuple(out)


def down_projection_bias(model: Any) -> Float[Tensor, "layer d_model"]:
    """The MLP down projections' biases stacked over layers (zeros where a block has none)."""
    d_model = int(model.cfg.d_model)
    rows = []
    for block in model.blocks:
        mlp = getattr(block, "mlp", None)
        try:
            bias = getattr(mlp, "b_out", None)
        except (AttributeError, RuntimeError):  # the bridge raises on a bias-free projection
            bias = None
        rows.append(torch.zeros(d_model) if not isinstance(bias, Tensor)
                    else bias.detach().float().cpu().reshape(d_model))
    return torch.stack(rows)
