"""What a dose scales: a :class:`Target` gives the interventions for one factor (0 is full
removal, 1 the clean model), on neurons of one or several MLPs, residual channels, or a direction
in the residual stream. Super neurons: Yu et al. (2024), "The Super Weight in Large Language
Models"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.edits import Intervention, ablate
from mechsink.measure.checks import check_channels, check_layers
from mechsink.model import act_name, write_in_place


@dataclass(frozen=True)
class Target:
    """A set a dose scales: ``edits(factor)`` gives the interventions for one factor; ``layers``
    are the blocks edited (later blocks are the "late" layers); ``channels`` the residual
    channels it is about (read out at position 0)."""

    description: str
    edits: Callable[[float], list[Intervention]]
    layers: tuple[int, ...]
    channels: tuple[int, ...] = ()


def neuron_set(
    model: Any, layer: int, neurons: Sequence[int], *, channels: Sequence[int] = (),
    positions: Sequence[int] = (0,),
) -> Target:
    """Scale the down-projection inputs (``mlp.hook_post``) of ``neurons`` at ``positions``."""
    units = [int(n) for n in neurons]
    if not units:
        raise BadInputError("neuron_set needs at least one neuron.")
    pos = list(positions)

    def edits(f: float) -> list[Intervention]:
        return [ablate(model, "mlp.hook_post", layer, mode="scale", scale=f, units=units,
                       positions=pos)]

    edits(1.0)  # checks layer and neuron indices now, before any work
    return Target(f"neurons {units} of MLP {layer} at positions {pos}", edits, (layer,),
                  tuple(int(c) for c in channels))


def neuron_sets(
    model: Any, sets: dict[int, Sequence[int]], *, channels: Sequence[int] = (),
    positions: Sequence[int] = (0,),
) -> Target:
    """Scale several MLPs' neurons at once: ``sets`` maps a block to its neurons (e.g. every
    complete set that writes a channel, when more than one block builds it)."""
    if not sets:
        raise BadInputError("neuron_sets needs at least one block.")
    parts = [neuron_set(model, lay, units, positions=positions)
             for lay, units in sorted(sets.items())]

    def edits(f: float) -> list[Intervention]:
        return [e for p in parts for e in p.edits(f)]

    what = "; ".join(f"MLP {lay}: {list(units)}" for lay, units in sorted(sets.items()))
    return Target(f"neurons ({what}) at positions {list(positions)}", edits,
                  tuple(sorted(sets)), tuple(int(c) for c in channels))


def _residual_edit(
    layer: int, positions: Sequence[int], fn: Callable[[Tensor], Tensor], description: str,
) -> Intervention:
    """An edit of ``hook_resid_pre`` at ``layer`` (the block's input: attention, MLP and the
    skip all see it), written in place as the bridge needs."""
    pos = list(positions)

    def hook(act: Tensor, hook: Any) -> Tensor:
        new = act.clone()
        new[:, pos] = fn(act[:, pos])
        return write_in_place(act, new)

    return Intervention(act_name("resid_pre", layer), hook, description)


def channel_set(
    model: Any, channels: Sequence[int], layers: Sequence[int], *,
    positions: Sequence[int] = (0,),
) -> Target:
    """Scale residual ``channels`` at ``positions`` in the input of each of ``layers``."""
    chans, lays = check_channels(model, channels), check_layers(model, layers)

    def edits(f: float) -> list[Intervention]:
        def fn(x: Tensor) -> Tensor:
            y = x.clone()
            y[..., chans] = x[..., chans] * f
            return y

        return [_residual_edit(lay, positions, fn, f"channels {chans} x{f} at positions "
                               f"{list(positions)}, input of block {lay}") for lay in lays]

    return Target(f"residual channels {chans} at positions {list(positions)}, input of blocks "
                  f"{lays}", edits, tuple(lays), tuple(chans))


def direction_set(
    model: Any, direction: Float[Tensor, " d_model"], layers: Sequence[int], *,
    positions: Sequence[int] = (0,), channels: Sequence[int] = (), name: str = "a direction",
) -> Target:
    """Scale the component of the residual along ``direction`` (normalised) at ``positions``
    in the input of each of ``layers``: ``x + (f - 1) (x . u) u``."""
    lays = check_layers(model, layers)
    u = unit_direction(model, direction)

    def edits(f: float) -> list[Intervention]:
        def fn(x: Tensor) -> Tensor:
            uu = u.to(x.device, x.dtype)
            return x + (f - 1.0) * (x @ uu)[..., None] * uu

        return [_residual_edit(lay, positions, fn, f"{name} x{f} at positions "
                               f"{list(positions)}, input of block {lay}") for lay in lays]

    return Target(f"{name} at positions {list(positions)}, input of blocks {lays}", edits,
                  tuple(lays), tuple(int(c) for c in channels))


def unit_direction(model: Any, direction: Tensor) -> Float[Tensor, " d_model"]:
    """``direction`` as a unit float32 vector, checked to be finite, non-zero, of length d_model."""
    d = int(model.cfg.d_model)
    u = torch.as_tensor(direction, dtype=torch.float32).flatten()
    if u.numel() != d or not bool(torch.isfinite(u).all()) or float(u.norm()) == 0.0:
        raise BadInputError(f"direction must be a finite non-zero vector of length {d}.")
    return u / u.norm()
