"""Receiver gradients from a plain forward/backward (no per-head forks).

EAP at the clean run and EAP-IG on inputs inject nothing into any receiver: every head's
query, key and value input is the same residual ``x``. Graph mode still forks ``x`` per head
(``use_split_qkv_input``: a ``[batch, pos, head, d_model]`` copy, normalised per head, one
projection per head, and all of it again in the backward), which made a gradient run cost
about three plain ones. Here the model runs plainly (only ``hook_mlp_in`` switched on) and
each head's input gradient is put together after the backward from the gradient at its
projection output: with ``q_h = norm(x) W_Q[h] + b_Q[h]`` (``attn.hook_q``, before rotary),

    dm/dx_h = J_norm(x)^T (w * (dm/dq_h W_Q[h]^T)),

``J_norm`` the normalisation's Jacobian (RMSNorm: ``y = x / s``, ``s`` its ``hook_scale``;
LayerNorm: ``y = (x - mean x) / s``) and ``w`` its gain, in closed form, for every head at once.
The model's own tensors check the premises on every run (layer 0: the norm's output from
``x`` and ``s``, each projection from the norm's output); where one fails (a query/key norm
after the projection, a gain of ``1 + w``, a fused projection), :func:`receiver_grads` returns
None and the caller uses graph mode. Tests compare both to 1e-5.

EAP-IG on activations moves one sender group's writes instead of the embedding (a layer's
heads, or its MLP with its neuron senders: ``group=``): nothing upstream of the group changes,
so the run starts at the group's block, from the clean residual, and the group's shifted
writes are added where they enter the residual stream (``hook_attn_out``, the sum of the
heads' writes; ``hook_resid_post`` after the MLP: ``hook_resid_mid`` would not do, a bridge
hands the MLP its input before that hook); every receiver downstream reads that one residual,
so the same closed form gives their gradients. Not on models whose attention output is
normalised again (the heads' writes are shares of a norm's output) or whose attention and MLP
run in parallel: graph mode there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.model import (
    act_name,
    hook_names,
    key_weights,
    norm_gain_bias,
    projection_bias,
    value_weights,
)
from mechsink.model.switches import mlp_in_only
from mechsink.patching import engine
from mechsink.patching.nodes import Receiver

#: relative tolerance of the premise checks (float32 activations)
TOLERANCE = 1e-4
#: switch (tests and benchmarks compare against graph mode with it off)
ENABLED = True


def head_weights(model: Any, kind: str) -> Float[Tensor, "layer head d_model d_head"]:
    """Per-head (query) or per-KV-head (key, value) input projections, raw and detached."""
    if kind == "q":
        return model.W_Q.detach()
    return key_weights(model) if kind == "k" else value_weights(model)


def _layers(run: Any) -> list[int]:
    g = run.graph
    return list(range(g.n_layers)) + ([g.point.layer] if g.point.kind == "attn" else [])


def _norm_kind(model: Any) -> str | None:
    kind = str(getattr(model.cfg, "normalization_type", None))
    return "rms" if kind.startswith("RMS") else "ln" if kind.startswith("LN") else None


def receiver_grads(run: Any, shifts: Sequence[float], pattern_layers: Sequence[int] = (),
                   *, group: Sequence[int] | None = None) -> dict[str, Tensor] | None:
    """The gradient of each copy's metric at every receiver hook (the keys and layout of
    :meth:`GraphRun.run_coeffs` with ``with_grad``: rows ``c * batch ..``), copy ``c`` run
    with the input embedding moved by ``shifts[c]`` times its delta and nothing injected; and
    at ``pattern_layers``' attention patterns. ``group`` (sender numbers of one stage: a
    layer's heads, or its MLP and neurons): those senders' writes move by ``shifts[c]`` times
    their delta instead, the run starting at their block (receivers before it get no
    gradient). None where the premises do not hold."""
    model = run.model
    norm = _norm_kind(model)
    if norm is None or not run.delta.numel():
        return None
    start, at = _start(run, group)
    if at is not None and (at not in hook_names(model) or run.post_norm
                           or getattr(model.cfg, "parallel_attn_mlp", False)):
        return None
    layers = [layer for layer in _layers(run) if layer >= start]
    kept: dict[str, Tensor] = {}
    grads: dict[str, Tensor] = {}

    def value(name: str) -> Any:
        def hook(act: Tensor, hook: Any) -> None:
            kept[name] = act.detach()
        return hook

    def grad_of(name: str) -> Any:
        # a tensor of its own, returned: the bridge then computes on from it (a hook that
        # returns nothing may see a reshaped view that nothing downstream reads)
        def hook(act: Tensor, hook: Any) -> Tensor | None:
            if not act.requires_grad:
                return None
            new = act.view_as(act)
            new.register_hook(lambda gr: grads.__setitem__(name, gr))
            return new
        return hook

    copies = len(shifts)
    resid0, leaf, hooks = moved_input(run, start, at, group, shifts)
    for layer in layers:
        hooks += [(act_name("resid_pre", layer), value(act_name("resid_pre", layer))),
                  (act_name("ln1.hook_scale", layer), value(act_name("ln1.hook_scale", layer)))]
        hooks += [(act_name(k, layer), grad_of(act_name(k, layer))) for k in ("q", "k", "v")]
    hooks += [(act_name("ln1.hook_normalized", start), value("ln1_normalized")),
              (act_name("ln1.hook_out", start), value("ln1_out"))]
    hooks += [(act_name(k, start), value(f"{k}0")) for k in ("q", "k", "v")]
    for slot in run.slots(start):
        if not slot.heads:  # the MLP's own input and a metric at a block's output
            hooks.append((slot.hook, grad_of(slot.hook)))
    hooks += [(act_name("pattern", layer), grad_of(act_name("pattern", layer)))
              for layer in pattern_layers if layer >= start]
    known = hook_names(model)  # a model without some of them (TransformerLens 2's LNPre has
    hooks = [(n, f) for n, f in hooks if n in known]  # no hook_out) fails the premises below
    with mlp_in_only(model):
        gradient_run(run, resid0, leaf, start, copies, hooks)
    weights = run.head_input_weights
    if not _premises_hold(model, kept, norm, weights, start):
        return None
    for layer in layers:
        x, scale = kept[act_name("resid_pre", layer)], kept[act_name("ln1.hook_scale", layer)]
        w = norm_gain_bias(model, layer, "ln1")[0]
        for kind in ("q", "k", "v"):
            gr = grads.pop(act_name(kind, layer), None)
            if gr is None:
                continue
            weight = weights[kind][layer]  # the gain folded into the (small) weights
            weight = weight if w is None else weight * w.to(weight.dtype).view(1, -1, 1)
            u = torch.einsum("bphe,hde->bphd", gr, weight)
            grads[Receiver(kind, layer).read_hook] = _norm_vjp(u, x, scale, norm)
    return grads


def moved_input(run: Any, start: int, at: str | None, group: Sequence[int] | None,
                shifts: Sequence[float]) -> tuple[Tensor, Tensor, list[tuple[str, Any]]]:
    """The input of a run moving the embedding (``at`` None) or ``group``'s writes (added at
    ``at``) by ``shifts[c]`` times their delta in copy ``c``: the residual entering block
    ``start`` (copies stacked), the leaf the backward pass ends at, and the injecting hook.

    A moved group's shift is the leaf, not the residual: the backward pass then stops where
    the group's writes enter (the part of block ``start`` before them, computed from the
    clean residual, needs no gradient)."""
    copies = len(shifts)
    shift = torch.tensor(list(shifts), dtype=run.delta.dtype).view(copies, 1, 1, 1)
    resid0 = run.clean.acts[act_name("resid_pre", start)].repeat(copies, 1, 1)
    if at is None:
        step = (shift * run.delta[:, :, 0]).flatten(0, 1).to(resid0.dtype)  # a float32 delta
        resid0 = (resid0 + step).detach().requires_grad_(True)  # must not lift a half-
        return resid0, resid0, []  # precision model's input
    assert group is not None
    moved = (shift * run.delta[:, :, list(group)].sum(2)).flatten(0, 1)
    moved = moved.detach().requires_grad_(True)

    def inject(act: Tensor, hook: Any) -> Tensor:
        return act + moved.to(act.dtype)
    return resid0, moved, [(at, inject)]


def gradient_run(run: Any, resid0: Tensor, leaf: Tensor, start: int, copies: int,
                 hooks: Sequence[tuple[str, Any]]) -> None:
    """One stacked forward from block ``start`` with ``hooks`` and the backward of the copies'
    metrics to ``leaf`` (the gradient hooks among ``hooks`` keep what they need); the
    caller sets the model's per-head switches."""
    vals = engine.run_patched(run.model, run.clean, [run.metric], run.needs, resid0, start,
                              copies, hooks, stacked=True, grad=True,
                              context="on the gradient run")[0]
    torch.autograd.grad(torch.stack(vals).sum(), [leaf], allow_unused=True)


def _start(run: Any, group: Sequence[int] | None) -> tuple[int, str | None]:
    """The block a run moving ``group``'s writes starts at, and the hook where they enter the
    residual stream (None: the embedding, moved in the run's input)."""
    if group is None:
        return 0, None
    stages = {run.graph.senders[i].stage for i in group}
    if len(stages) != 1 or 0 in stages:
        raise ValueError(f"a group is the senders of one stage after the embedding, got "
                         f"stages {sorted(stages)}.")
    stage = stages.pop()
    layer = (stage - 1) // 2
    return layer, act_name("attn_out" if stage % 2 else "resid_post", layer)


def _norm_vjp(u: Tensor, x: Float[Tensor, "rows pos d_model"], scale: Tensor, norm: str
              ) -> Float[Tensor, "rows pos head d_model"]:
    """``J^T u`` per head for ``y = x / s`` (RMS) or ``y = (x - mean x) / s`` (LN), ``s``
    the norm's scale (``hook_scale``, eps included), ``u`` ``[rows, pos, head, d_model]``
    (overwritten: the result is computed in place, one pass per term, no temporaries of
    ``u``'s size):

    RMS: ``(u - x (x . u) / (d s^2)) / s``; LN: ``(u - mean u - xhat (xhat . u) / d) / s``
    with ``xhat = (x - mean x) / s``."""
    d = x.shape[-1]
    s = scale.reshape(*x.shape[:2], 1)
    ref = (x - x.mean(-1, keepdim=True)) / s if norm == "ln" else x
    k = torch.einsum("bphd,bpd->bph", u, ref) / (d if norm == "ln" else d * s * s)
    if norm == "ln":
        u.sub_(u.mean(-1, keepdim=True))
    u.addcmul_(ref.unsqueeze(2), k.unsqueeze(-1), value=-1.0)
    return u.div_(s.unsqueeze(-1))


def _close(a: Tensor, b: Tensor) -> bool:
    return bool((a - b).abs().max() <= TOLERANCE * max(1.0, float(b.abs().max())))


def _premises_hold(model: Any, kept: dict[str, Tensor], norm: str,
                   weights: dict[str, Tensor], layer: int = 0) -> bool:
    """The run's first block ``layer``: the norm's output is its gain times ``x / s`` (or
    ``(x - mean) / s``) plus its bias, and q/k/v are their projections of it.

    A bridge hooks both steps (``hook_normalized`` before the gain, ``hook_out`` after it); a
    HookedTransformer's norm has no ``hook_out`` and its ``hook_normalized`` is before the
    gain (RMSNorm) or after gain and bias (LayerNorm): whichever it holds is checked, and the
    output is computed from it."""
    needed = ("ln1_normalized", "q0", "k0", "v0")
    if any(k not in kept for k in needed):
        return False
    x, s = kept[act_name("resid_pre", layer)], kept[act_name("ln1.hook_scale", layer)]
    s = s.reshape(*x.shape[:2], 1)
    centred = x - x.mean(-1, keepdim=True) if norm == "ln" else x
    normed = kept["ln1_normalized"]
    w, b = norm_gain_bias(model, layer, "ln1")

    def gained(y: Tensor) -> Tensor:
        return y * (1.0 if w is None else w) + (0.0 if b is None else b)

    if "ln1_out" in kept:
        out = kept["ln1_out"]
        if not (_close(centred / s, normed) and _close(gained(normed), out)):
            return False
    elif _close(centred / s, normed):
        out = gained(normed)
    elif _close(gained(centred / s), normed):
        out = normed
    else:
        return False
    return projections_hold(model, out, {k: kept[f"{k}0"] for k in "qkv"}, weights, layer)


def projections_hold(model: Any, normed: Float[Tensor, "rows pos d_model"],
                     seen: dict[str, Tensor], weights: dict[str, Tensor], layer: int) -> bool:
    """Whether block ``layer``'s ``hook_q/k/v`` (``seen["q"]`` ...) are ``normed`` (its
    attention norm's output) times the per-head weights plus the bias, within
    :data:`TOLERANCE`: the premise both closed forms here and exact edges without forks
    (:attr:`GraphRun.head_projections`) rest on."""
    for kind, bias_name in zip("qkv", ("b_Q", "b_K", "b_V"), strict=True):
        want, w = seen.get(kind), weights[kind][layer]
        if want is None or normed.shape[-1] != w.shape[1]:
            return False
        proj = torch.einsum("bpd,hde->bphe", normed, w)
        bias = projection_bias(model, bias_name, w.shape[0], layer)
        if bias is not None:
            proj = proj + bias
        if proj.shape != want.shape or not _close(proj, want):
            return False
    return True
