"""Surgery: position 0 made ordinary along a channel or a direction (set to its median over the
later positions of the sequence, what an ordinary token carries), at one block or at every block
from one on, so that no later block can rebuild it; and the direction to operate along."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.edits import Intervention
from mechsink.interventions.targets import unit_direction
from mechsink.measure.checks import check_channels, check_layers
from mechsink.model import act_name, write_in_place


def _surgery_layers(model: Any, layer: int, every_layer_from: bool) -> list[int]:
    check_layers(model, [layer])
    return list(range(layer, int(model.cfg.n_layers))) if every_layer_from else [layer]


def channel_surgery(
    model: Any, channels: Sequence[int], layer: int, *, every_layer_from: bool = False,
    position: int = 0,
) -> list[Intervention]:
    """Set ``channels`` at ``position`` to their median over the sequence's positions after it
    (an ordinary token's value), in the input of ``layer`` (or of every block from ``layer``
    on: then no later block can rebuild the channel)."""
    chans = check_channels(model, channels)
    out = []
    for lay in _surgery_layers(model, layer, every_layer_from):
        def hook(act: Tensor, hook: Any, _c: list[int] = chans) -> Tensor:
            if act.shape[1] < position + 2:
                raise BadInputError("channel surgery needs a position after the edited one.")
            new = act.clone()
            med = act[:, position + 1:, _c].median(dim=1).values
            new[:, position, _c] = med
            return write_in_place(act, new)

        out.append(Intervention(act_name("resid_pre", lay), hook,
                                f"channels {chans} at position {position} set to their median "
                                f"over later positions, input of block {lay}"))
    return out


def direction_surgery(
    model: Any, direction: Float[Tensor, " d_model"], layer: int, *,
    every_layer_from: bool = False, position: int = 0,
) -> list[Intervention]:
    """Replace the component along ``direction`` at ``position`` by its median over the later
    positions: ``x0 - (x0 . u) u + median_p(x_p . u) u``."""
    u = unit_direction(model, direction)
    out = []
    for lay in _surgery_layers(model, layer, every_layer_from):
        def hook(act: Tensor, hook: Any) -> Tensor:
            if act.shape[1] < position + 2:
                raise BadInputError("direction surgery needs a position after the edited one.")
            uu = u.to(act.device, act.dtype)
            proj = act @ uu  # [batch, pos]
            med = proj[:, position + 1:].median(dim=1).values
            new = act.clone()
            new[:, position] = act[:, position] + (med - proj[:, position])[:, None] * uu
            return write_in_place(act, new)

        out.append(Intervention(act_name("resid_pre", lay), hook,
                                f"direction at position {position} set to its median over "
                                f"later positions, input of block {lay}"))
    return out


@torch.no_grad()
def top_direction(
    model: Any, tokens: Int[Tensor, "batch pos"], layer: int, position: int = 0
) -> Float[Tensor, " d_model"]:
    """The top right-singular vector of the residual stream entering ``layer`` at
    ``position`` over the prompts (uncentred: the direction position 0's state points in),
    signed so that its mean projection is positive."""
    check_layers(model, [layer])
    name = act_name("resid_pre", layer)
    _, cache = model.run_with_cache(tokens, names_filter=[name], return_type=None)
    x = cache[name][:, position].double()
    u = torch.linalg.svd(x, full_matrices=False).Vh[0]
    if float((x @ u).mean()) < 0:
        u = -u
    return u.float().cpu()
