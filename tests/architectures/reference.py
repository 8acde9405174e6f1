"""Hand references for the architecture suite: path patching written with nothing but
``run_with_hooks`` (one forward per step, no stacking, no mechsink engine), and edits written
as plain forward hooks on the transformers model itself.

Path patching follows ARENA's statement of Wang et al. 2022 ("Interpretability in the Wild"):
step 1 runs the clean input with the sender's ``hook_z`` head taken from the corrupted run and
every other head (``hook_z``) and MLP (``hook_mlp_out``) frozen at its clean value, recording
the receiver's input; step 2 runs the clean input with only the receiver's slice replaced by
the recorded one. With the metric as receiver step 1's logits are the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

Metric = Callable[[Tensor], Tensor]

#: hf module names of an attention block's output projection (its input: heads concatenated)
OUT_PROJ = ("o_proj", "dense", "c_proj", "out_proj", "wo", "o")


def _names(model: Any) -> tuple[list[str], list[str]]:
    n = int(model.cfg.n_layers)
    return ([f"blocks.{lay}.attn.hook_z" for lay in range(n)],
            [f"blocks.{lay}.hook_mlp_out" for lay in range(n)])


def _set(value: Tensor) -> Callable[..., Tensor]:
    def hook(act: Tensor, hook: Any) -> Tensor:
        return value.clone()

    return hook


@torch.no_grad()
def path_patch_by_hand(model: Any, clean: Tensor, corrupted: Tensor, metric: Metric,
                       sender: tuple[int, int], receiver: tuple[str, int, int] | None
                       ) -> tuple[float, float]:
    """(patched metric, clean metric) of head ``sender = (layer, head)`` -> ``receiver``
    (``(hook suffix, layer, unit)``, e.g. ``("attn.hook_q", 1, 0)``; None: the metric).

    Raises AssertionError when the receiver's hook never fires (a no-op patch would
    otherwise pass as "no effect")."""
    zs, mlps = _names(model)
    _, c = model.run_with_cache(clean, names_filter=zs + mlps)
    _, x = model.run_with_cache(corrupted, names_filter=zs)
    s_layer, s_head = sender
    freeze = []
    for name in zs + mlps:
        value = c[name].clone()
        if name == zs[s_layer]:
            value[:, :, s_head] = x[name][:, :, s_head]
        freeze.append((name, _set(value)))
    clean_value = float(metric(model(clean)))
    if receiver is None:
        return float(metric(model.run_with_hooks(clean, fwd_hooks=freeze))), clean_value
    suffix, r_layer, unit = receiver
    hook_name = f"blocks.{r_layer}.{suffix}"
    seen: dict[str, Tensor] = {}

    def record(act: Tensor, hook: Any) -> None:
        seen["act"] = act.clone()

    model.run_with_hooks(clean, fwd_hooks=[(hook_name, record), *freeze])
    assert "act" in seen, f"{hook_name} never fired"
    recorded = seen.pop("act")

    def patch(act: Tensor, hook: Any) -> Tensor:
        new = act.clone()
        new[:, :, unit] = recorded[:, :, unit]
        return new

    patched = model.run_with_hooks(clean, fwd_hooks=[(hook_name, patch)])
    return float(metric(patched)), clean_value


def decoder_layers(hf: nn.Module, n_layers: int) -> nn.ModuleList:
    """The transformers model's list of decoder blocks (the first ModuleList of that length
    named like one)."""
    for name, module in hf.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) == n_layers and \
                name.rsplit(".", 1)[-1] in ("layers", "h", "blocks", "layer", "decoder_layers"):
            return module
    raise LookupError(f"no list of {n_layers} decoder layers in {type(hf).__name__}")


def attention_out_proj(layer: nn.Module) -> nn.Module:
    """The attention's output projection inside one decoder block (its input is the heads'
    outputs side by side)."""
    found = [m for name, m in layer.named_modules()
             if "att" in name.lower() and name.rsplit(".", 1)[-1].lower() in OUT_PROJ]
    if len(found) != 1:
        raise LookupError(f"{len(found)} candidate attention output projections in "
                          f"{type(layer).__name__}")
    return found[0]


def zero_head_input(head: int, d_head: int) -> Callable[..., Any]:
    """A forward pre-hook zeroing one head's slice of the output projection's input."""

    def pre(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        z = args[0].clone()
        z[..., head * d_head:(head + 1) * d_head] = 0.0
        return (z, *args[1:])

    return pre


def scale_block_input(positions: list[int], factor: float) -> Callable[..., Any]:
    """A forward pre-hook (``with_kwargs``) scaling a decoder block's hidden states at
    ``positions``."""

    def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if args:
            h = args[0].clone()
            h[:, positions] *= factor
            return (h, *args[1:]), kwargs
        h = kwargs["hidden_states"].clone()
        h[:, positions] *= factor
        return args, {**kwargs, "hidden_states": h}

    return pre


@torch.no_grad()
def hf_logits_with(hf: nn.Module, tokens: Tensor, module: nn.Module,
                   pre_hook: Callable[..., Any], with_kwargs: bool = False) -> Tensor:
    """The transformers model's logits with ``pre_hook`` on ``module`` (removed after)."""
    handle = module.register_forward_pre_hook(pre_hook, with_kwargs=with_kwargs)
    try:
        return hf(tokens).logits
    finally:
        handle.remove()
