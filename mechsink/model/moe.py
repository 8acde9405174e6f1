"""Mixture-of-experts MLPs: the experts' weights per block, in one layout.

transformers 5 stores the routed experts of Mixtral, Qwen2/3-MoE, OLMoE, FlexOlmo, PhiMoE,
MiniMax and many more as one module with 3-D parameters: ``gate_up_proj [expert, 2 x d_expert,
d_model]`` (gate rows first, then up rows), ``down_proj [expert, d_model, d_expert]`` and an
``act_fn``: expert ``e`` computes ``down_e(act(gate_e x) * up_e x)``. Its down projection's input
``act(gate_e x) * up_e x`` is where the expert's super neurons live. TransformerLens's MoE bridge
records the router's choice (``mlp.hook_expert_indices``, ``mlp.hook_expert_weights``) and the
block's input (``mlp.hook_in``); with these weights the measurement needs nothing else. A block
laid out otherwise (GPT-OSS's interleaved, biased, clamped experts; Granite-MoE's
``input_linear``) gets a reason instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model.kinds import hf_model_of


@dataclass(frozen=True)
class Experts:
    """One block's routed experts: ``hidden(x)`` is the down projections' input per expert."""

    gate: Float[Tensor, "expert d_expert d_model"]
    up: Float[Tensor, "expert d_expert d_model"]
    down: Float[Tensor, "expert d_model d_expert"]
    act: Callable[[Tensor], Tensor]
    top_k: int
    shared: bool  # the block also has a shared (always-on) expert, not measured here

    @property
    def n_experts(self) -> int:
        return int(self.gate.shape[0])

    def hidden(self, x: Float[Tensor, "token d_model"], expert: int
               ) -> Float[Tensor, "token d_expert"]:
        """Expert ``expert``'s down-projection input for the tokens ``x``."""
        g, u = self.gate[expert].to(x.dtype), self.up[expert].to(x.dtype)
        return self.act(x @ g.T) * (x @ u.T)


def _plain(module: Any) -> Any:
    """The transformers module under a bridge component."""
    return getattr(module, "_original_component", None) or module


def _layers(model: Any) -> list[Any]:
    hf = hf_model_of(model)
    inner = getattr(hf, "model", hf)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise AttributeError("no decoder layers")
    return [_plain(layer) for layer in layers]


def _block_experts(mlp: Any) -> Experts | str:
    """The block's experts, or why they do not fit the fused layout."""
    experts = getattr(mlp, "experts", None)
    gate_up = getattr(experts, "gate_up_proj", None)
    down = getattr(experts, "down_proj", None)
    act = getattr(experts, "act_fn", None)
    name = type(experts if experts is not None else mlp).__name__
    if not isinstance(gate_up, Tensor) or not isinstance(down, Tensor) or act is None:
        return f"{name} has no fused gate_up_proj / down_proj experts with an act_fn"
    if any(n.endswith("_bias") for n, _ in experts.named_parameters()):
        return f"{name}'s experts have biases (a layout the measurement does not model)"
    n_exp, d_expert = int(down.shape[0]), int(down.shape[2])
    if gate_up.ndim != 3 or tuple(gate_up.shape[:2]) != (n_exp, 2 * d_expert) \
            or gate_up.shape[2] != down.shape[1]:
        return (f"{name}'s gate_up_proj {tuple(gate_up.shape)} is not [expert, 2 x d_expert, "
                f"d_model] for down_proj {tuple(down.shape)}")
    router = _plain(getattr(mlp, "gate", None) or getattr(mlp, "router", None))
    top_k = getattr(router, "top_k", None) or getattr(mlp, "top_k", None)
    if top_k is None:
        return f"{type(mlp).__name__}'s router names no top_k"
    w = gate_up.detach()
    return Experts(w[:, :d_expert], w[:, d_expert:], down.detach(), act, int(top_k),
                   getattr(mlp, "shared_expert", None) is not None
                   or getattr(mlp, "shared_experts", None) is not None)


def moe_experts(model: Any) -> tuple[Experts, ...] | str | None:
    """Per block the routed experts (:class:`Experts`); None for a dense model (no block has
    experts); a string saying why when some block's experts cannot be read."""
    try:
        layers = _layers(model)
    except (AttributeError, TypeError, BadInputError):  # no transformers model behind it
        return None
    mlps = [_plain(getattr(layer, "mlp", None) or getattr(layer, "block_sparse_moe", None))
            for layer in layers]
    if not any(getattr(m, "experts", None) is not None for m in mlps):
        return None
    out = []
    for i, mlp in enumerate(mlps):
        got = _block_experts(mlp)
        if isinstance(got, str):
            return f"block {i}: {got}"
        out.append(got)
    return tuple(out)
