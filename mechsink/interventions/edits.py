"""Declared interventions: name a site and what to do there; mechsink writes the hook.

An :class:`Intervention` is a hook name, a function of (activation, hook) and a one-line
description. :func:`applied` installs a list of them for the duration of a ``with`` block and
always removes them afterwards, also when the block raises. Builders here cover the edits the
sink papers make:

- :func:`ablate`: the ablations of :mod:`mechsink.interventions.ablation` (zero, batch_mean,
  position_mean, resample; the same vocabulary as patching), scaling or setting, of heads, neurons,
  channels and positions, at a site named in :mod:`mechsink.names`'s vocabulary (``"attn.hook_z"`` +
  ``layer``, ``"blocks.3.hook_mlp_out"``, ``"L3H5@0"``, ``"L3N1229@0"``, ``"MLP3@0"``, ...);
- :func:`attend_only_to_self`: make query position ``k`` attend only to itself (a second
  "position 0"; Gu et al. 2024, "When Attention Sink Emerges in Language Models");
- :func:`scale_tokens`: multiply chosen tokens' residual stream by a factor (norm);
- :func:`amplify_deviation`: amplify chosen tokens' deviation from their mean over sequences
  (variance; Li, Jiang, Sun et al. 2026, "The Structural Origin of Attention Sink");
- :func:`remove_query_bias` and :func:`rotate_keys`: the GPT-2 query-bias ablations.

An intervention that reads positions records the largest one (``max_position``), and
:func:`applied` checks the sequence against it as the input is embedded, before any block runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.ablation import KINDS, as_ablation
from mechsink.model import (
    act_name,
    has_hook,
    has_learned_sink,
    key_bias,
    n_kv_heads,
    query_bias,
)
from mechsink.model.support import check_edits_reach, check_hooks_supported, check_supported
from mechsink.names import KINDS as PLACE_KINDS
from mechsink.names import UNIT_WORDS, Name, parse_name, unit_count

HookFn = Callable[[Tensor, Any], Tensor]

# the kinds ablate edits: those of mechsink.names' table laid out [batch, pos, unit, ...]
_ABLATABLE = {k.hook: k for k in PLACE_KINDS.values()
              if k.in_block and k.unit and k.pos_dim == 1}


@dataclass(frozen=True)
class Intervention:
    """One hook-level edit: where, what, a line saying so, and the largest sequence position
    it touches (None: any length works)."""

    hook: str
    fn: HookFn
    description: str
    max_position: int | None = None


def _length_check(interventions: Sequence[Intervention]) -> HookFn | None:
    """A hook on the embedding that rejects a sequence too short for some intervention."""
    needing = [i for i in interventions if i.max_position is not None]
    if not needing:
        return None

    def check(act: Tensor, hook: Any) -> None:
        n_pos = act.shape[1]
        for i in needing:
            if i.max_position is not None and i.max_position >= n_pos:
                raise BadInputError(
                    f"{i.description}: position {i.max_position} is beyond the sequence "
                    f"({n_pos} tokens, positions 0..{n_pos - 1}); use a longer input or "
                    "other positions."
                )

    return check


@contextmanager
def applied(model: Any, interventions: Sequence[Intervention]) -> Iterator[Any]:
    """Run the block with the interventions installed; they are removed however it ends.

    A sequence shorter than an intervention's positions is an error as soon as it is
    embedded (before any block runs). An edit of a hook the model never fires, or of a
    pattern whose edits it discards, is refused in one line before the block runs
    (:func:`_check_edits`)."""
    _check_edits(model, [i.hook for i in interventions], "these edits")
    hooks = [(i.hook, i.fn) for i in interventions]
    check = _length_check(interventions)
    if check is not None and has_hook(model, "hook_embed"):
        hooks.insert(0, ("hook_embed", check))
    with model.hooks(fwd_hooks=hooks):
        yield model


def _check_edits(model: Any, hooks: Sequence[str], what: str) -> None:
    """One line, before any work, when the edits of ``hooks`` cannot run exactly: a model the
    interventions do not support (no softmax attention in every block: on Mamba a
    ``scale_tokens`` edit of the block input that fires is 1.4 off the same edit made in
    transformers), a hook it never fires, or a pattern whose edits it discards."""
    check_supported(model, "interventions")
    check_hooks_supported(model, "interventions", what, hooks)
    check_edits_reach(model, "interventions", what, hooks)


def _check_layer(model: Any, layer: int) -> None:
    if not 0 <= layer < model.cfg.n_layers:
        raise BadInputError(
            f"layer {layer} is out of range: the model has layers 0..{model.cfg.n_layers - 1}."
        )


MODES = (*KINDS, "scale", "set")


def ablate(
    model: Any,
    site: str | tuple[Any, ...] | Name,
    layer: int | None = None,
    *,
    mode: str = "zero",
    scale: float = 0.0,
    value: float = 0.0,
    units: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    seed: int = 0,
) -> Intervention:
    """Ablate, scale or set entries of the hook ``site`` names (at ``layer``, unless the name
    has one: ``"attn.hook_z"`` + ``layer=3`` and ``"blocks.3.attn.hook_z"`` are the same).

    A head, neuron or position in the name (``"L3H5@0"``) is the same as ``units=[5]``,
    ``positions=[0]``. ``units`` picks heads (attention sites; KV heads for k and v), neurons
    (``mlp.hook_post``) or channels (residual and output sites); ``positions`` picks sequence
    positions (None: all). ``mode`` is one of :mod:`mechsink.interventions.ablation`'s kinds,
    computed on the run's own activations: ``zero``; ``batch_mean`` (the mean over the run's batch
    at each position); ``position_mean`` (the mean over the sequence's unchosen positions);
    ``resample`` (whole sequences of the run's batch drawn with ``seed``). Or ``scale``
    (multiply by ``scale``) or ``set`` (write ``value``, e.g. plant a massive channel).
    """
    name = parse_name(site, layer)
    if name.relative not in _ABLATABLE:
        raise BadInputError(
            f"unknown site {site!r} for ablate: name one of {', '.join(_ABLATABLE)} (with "
            "layer=), a full hook name (blocks.3.attn.hook_z) or a component (L3H5, L3N7, "
            "MLP3, ATTN3, resid3), optionally followed by @POS.")
    if name.layer is None:
        raise BadInputError(f"{site!r} lives in every block: give layer= (or write "
                            f"blocks.<layer>.{name.relative}).")
    if name.unit is not None:
        if units is not None:
            raise BadInputError(f"{site!r} already names its unit: drop units=.")
        units = [name.unit_on(model)]  # L3H5.k: the KV head query head 5 reads
    if name.position is not None:
        if positions is not None:
            raise BadInputError(f"{site!r} already names its position: drop positions=.")
        positions = [name.position]
    layer, site = name.layer, name.relative
    if mode not in MODES:
        hint = (" (say which mean: position_mean, over the sequence's other positions, or "
                "batch_mean, over the batch)") if mode == "mean" else ""
        raise BadInputError(f"unknown ablation mode {mode!r}: use {', '.join(MODES)}{hint}.")
    _check_layer(model, layer)
    _check_edits(model, [act_name(site, layer)], f"{mode} of {site}")
    Name(_ABLATABLE[site].name, layer).check(model)  # a hook the model lacks: say so now
    axis = _ABLATABLE[site].unit
    n_units = unit_count(model, _ABLATABLE[site].name)
    if units is not None and not all(0 <= u < n_units for u in units):
        raise BadInputError(f"{UNIT_WORDS[axis]} index out of range in {list(units)}: "
                            f"blocks.{layer}.{site} has {n_units}.")
    if positions is not None and (not positions or min(positions) < 0):
        raise BadInputError(f"positions must be non-negative and not empty, got "
                            f"{list(positions)}.")
    abl = as_ablation(mode, seed=seed) if mode in KINDS else None
    if abl is not None and abl.kind == "position_mean" and positions is None:
        raise BadInputError("a position_mean ablation needs positions= (the mean is over the "
                            "others).")

    def fn(act: Tensor, hook: Any) -> Tensor:
        n_pos = act.shape[1]
        if positions is not None and max(positions) >= n_pos:
            raise BadInputError(f"position {max(positions)} is beyond the sequence "
                                f"({n_pos} tokens).")
        on_pos = torch.zeros(n_pos, dtype=torch.bool, device=act.device)
        on_pos[slice(None) if positions is None else list(positions)] = True
        on_unit = torch.zeros(n_units, dtype=torch.bool, device=act.device)
        on_unit[slice(None) if units is None else list(units)] = True
        chosen = (on_pos[:, None] & on_unit[None, :]).reshape(
            1, n_pos, n_units, *([1] * (act.dim() - 3)))
        if mode == "set":
            replacement = torch.full_like(act, value)
        elif mode == "scale":
            replacement = act * scale
        else:
            assert abl is not None
            replacement = abl.values(act, on_pos)
        return torch.where(chosen, replacement, act)

    name = str(abl) if abl is not None else mode
    what = f"{name} ablation" + (f" x{scale}" if mode == "scale" else "") + (
        f" to {value}" if mode == "set" else "")
    which = f"{UNIT_WORDS[axis]}s {list(units)}" if units is not None else "all units"
    pos = list(positions) if positions is not None else "all"
    hook = act_name(site, layer)
    return Intervention(hook, fn, f"{what} of {which} at positions {pos}, {hook}",
                        None if positions is None else max(positions))


def attend_only_to_self(
    model: Any, layers: Sequence[int], position: int | None = None,
    units: Sequence[int] | None = None, strength: float = 1.0,
) -> list[Intervention]:
    """Query ``position`` attends only to itself in the chosen layers and heads (``units``;
    None: all): every other key masked for that query.

    The softmax of a row whose only allowed key is ``k`` is one-hot on ``k``, so the edit sets
    the pattern row one-hot. On a model with a learned sink logit (GPT-OSS's per-head
    ``sinks``, a softmax column that is dropped afterwards, so pattern rows sum to less than
    1) the masked row keeps the learned sink's share: the row's weight on ``k`` becomes
    ``p_k / (p_k + p_sink)``, with ``p_sink = 1 - sum(row)`` read from the pattern itself.

    ``strength`` in [0, 1] doses the isolation: the row becomes ``(1 - s) row + s one_hot``,
    so the query keeps a share ``1 - s`` of the attention it took from the other positions
    (1: fully isolated, the default; 0: no edit).
    """
    if position is None:
        raise BadInputError("attend_only_to_self needs position= (the query that should "
                            "attend only to itself).")
    if isinstance(strength, bool) or not 0.0 <= float(strength) <= 1.0:
        raise BadInputError(f"strength must lie in [0, 1] (the share of isolation), got "
                            f"{strength!r}.")
    s = float(strength)
    key_pos = int(position)
    head_list = None if units is None else list(units)
    for layer in layers:
        _check_layer(model, layer)
    _check_edits(model, [act_name("pattern", layer) for layer in layers],
                 "attend_only_to_self")
    out = []
    for layer in layers:
        _check_layer(model, layer)
        learned_sink = has_learned_sink(model, layer)

        def fn(pattern: Tensor, hook: Any, learned_sink: bool = learned_sink) -> Tensor:
            if key_pos >= pattern.shape[-1]:
                raise BadInputError(f"position {key_pos} is outside the sequence.")
            edited = pattern.clone()
            h = slice(None) if head_list is None else head_list
            row = pattern[:, h, key_pos, :]
            own = torch.ones_like(row[..., key_pos])
            if learned_sink:  # the sink column's share, 1 - the row's sum, stays
                p_self = row[..., key_pos].double()
                p_sink = (1.0 - row.double().sum(-1)).clamp_min(0.0)
                own = (p_self / (p_self + p_sink).clamp_min(1e-300)).to(row.dtype)
            isolated = torch.zeros_like(row)
            isolated[..., key_pos] = own
            edited[:, h, key_pos, :] = isolated if s == 1.0 else (1.0 - s) * row + s * isolated
            return edited

        dose = "" if s == 1.0 else f" (strength {s:g})"
        out.append(Intervention(act_name("pattern", layer), fn,
                                f"layer {layer}: query {key_pos} attends only to itself{dose}",
                                key_pos))
    return out


def amplify_deviation(
    model: Any, layer: int, positions: Sequence[int], factor: float,
    center: Float[Tensor, "n_positions d_model"],
) -> Intervention:
    """The variance of token ``positions``' representations amplified by ``factor ** 2``: the
    residual stream entering ``layer`` at each position ``k`` becomes
    ``center[k] + factor (x_k - center[k])``. With ``center`` the mean over sequences at that
    position (fixed beforehand from the clean run over every prompt, so batching does not
    change it) the variance over sequences there grows by ``factor ** 2`` and the mean stays:
    the structural-origin paper's amplified variance of a targeted token (Li, Jiang, Sun et
    al. 2026)."""
    _check_layer(model, layer)
    pos = [int(k) for k in positions]
    if not pos or min(pos) < 0:
        raise BadInputError(f"positions must be non-negative and not empty, got {pos}.")
    c = torch.as_tensor(center).detach()
    if c.dim() == 1:
        c = c.expand(len(pos), -1)
    if tuple(c.shape) != (len(pos), int(model.cfg.d_model)):
        raise BadInputError(f"center must hold one d_model vector per position "
                            f"({len(pos)} x {model.cfg.d_model}), got {tuple(c.shape)}.")
    hook = act_name("hook_resid_pre", layer)
    _check_edits(model, [hook], "amplify_deviation")

    def fn(act: Tensor, hook: Any) -> Tensor:
        edited = act.clone()
        m = c.to(device=act.device, dtype=act.dtype)
        edited[:, pos] = m + factor * (act[:, pos] - m)
        return edited

    return Intervention(hook, fn, f"deviation from the mean over sequences x{factor:g} at "
                                  f"positions {pos}, {hook}", max(pos))


def scale_tokens(model: Any, layer: int, positions: Sequence[int], factor: float) -> Intervention:
    """Multiply the residual stream entering ``layer`` at ``positions`` by ``factor``."""
    return ablate(model, "hook_resid_pre", layer, mode="scale", scale=factor, positions=positions)


def remove_query_bias(model: Any, layer: int) -> Intervention:
    """Subtract ``b_Q`` from every query of ``layer`` (its attention then has no query bias)."""
    _check_layer(model, layer)
    b_q = query_bias(model, layer)
    if b_q is None:
        raise BadInputError(
            "this model's attention has no query bias (its query projection is bias-free), "
            "so there is nothing to remove; the query-bias circuit is a GPT-2-style feature."
        )

    def fn(q: Tensor, hook: Any) -> Tensor:
        return q - b_q.to(q.dtype)

    return Intervention(act_name("attn.hook_q", layer), fn, f"layer {layer}: query bias removed")


def remove_key_bias(model: Any, layer: int) -> Intervention:
    """Subtract ``b_K`` from every key of ``layer`` (before any rotation; per KV head)."""
    _check_layer(model, layer)
    b_k = key_bias(model)
    if b_k is None or not bool(b_k[layer].detach().abs().max() > 0):
        raise BadInputError("this model's attention has no key bias at layer "
                            f"{layer}, so there is nothing to remove.")
    bias = b_k[layer].detach()

    def fn(k: Tensor, hook: Any) -> Tensor:
        return k - bias.to(k.dtype)

    return Intervention(act_name("attn.hook_k", layer), fn, f"layer {layer}: key bias removed")


def rotate_keys(model: Any, layer: int, seed: int = 0) -> Intervention:
    """Replace ``W_K`` by ``W_K R`` with a random orthogonal ``R`` per head (``b_K`` kept).

    Keeps each key's norm but destroys the alignment between ``W_K`` and ``W_Q``.
    """
    _check_layer(model, layer)
    b_all = key_bias(model)
    b_k = None if b_all is None else b_all[layer]
    d_head = model.cfg.d_head
    gen = torch.Generator().manual_seed(seed)
    n_kv = n_kv_heads(model)
    rot = torch.linalg.qr(torch.randn(n_kv, d_head, d_head, generator=gen))[0]

    def fn(k: Tensor, hook: Any) -> Tensor:
        bias = 0.0 if b_k is None else b_k.to(k.dtype)
        return torch.einsum("bphe,hef->bphf", k - bias, rot.to(k.dtype)) + bias

    return Intervention(act_name("attn.hook_k", layer), fn,
                        f"layer {layer}: W_K rotated by a random orthogonal matrix (seed {seed})")


# --- first-token manipulations (edits of the input, not hooks) --------------------------------


def remove_bos(tokens: Tensor, bos_id: int) -> Tensor:
    """Drop position 0 when every sequence starts with ``bos_id`` (the text then starts at 0)."""
    if not bool((tokens[:, 0] == bos_id).all()):
        raise BadInputError(f"not every sequence starts with BOS id {bos_id}: nothing to remove.")
    return tokens[:, 1:]


def replace_first(tokens: Tensor, ids: Tensor | int) -> Tensor:
    """Put ``ids`` (one per sequence, or one for all) at position 0, keeping the length."""
    out = tokens.clone()
    out[:, 0] = ids
    return out


def shift_to_first(tokens: Tensor, k: int) -> Tensor:
    """Cut the first ``k`` tokens so the token at position ``k`` now sits at position 0."""
    if not 0 <= k < tokens.shape[1] - 1:
        raise BadInputError(f"k={k} must leave at least two tokens (sequence length "
                            f"{tokens.shape[1]}).")
    return tokens[:, k:]
