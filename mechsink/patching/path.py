"""Path patching (Wang et al. 2022; ARENA's IOI statement): the effect of senders on the metric
*through* chosen receivers only.

For each sender group, in a batch of groups:

1. run the clean input with the senders' outputs taken from the corrupted run and every other
   component (each head's ``hook_z``, each MLP's ``hook_mlp_out``) frozen at its clean value;
   record the receivers' inputs;
2. run the clean input again with only the receivers' inputs replaced by the recorded ones,
   and evaluate the metric. With ``receivers=["metric"]`` step 1's metric is the answer (the
   senders' direct effect).

Normalisation scales (``scales=``): ``"recomputed"`` (default) lets every LayerNorm/RMSNorm
recompute its scale in step 1, as the model would; ``"frozen"`` pins every ``ln*.hook_scale``
to the clean run's value, so a sender reaches a receiver linearly through the norm. With a
massive activation at position 0 the scale there is set by one channel, and a sender that moves
it changes every receiver that reads position 0: the two choices can give different answers,
and a path that exists only through a norm's scale shows up only under "recomputed".

Ablation instead of a corrupted input (``ablation=``, with ``corrupted=None``): each sender's
"corrupted" value is ``"zero"``, its ``"mean"`` over the clean batch, or its
``"position_mean"``: the mean over positions 1.. of the same sequence, i.e. the value an
ordinary position has. The last one asks "what does this component's *position-0* output do",
the question of the P0-sink circuit (seeds/004), where no corrupted text makes position 0
ordinary (the sink does not depend on the first token).

Component names (any number of digits): ``embed``, ``L12H3`` (head), ``MLP12``, ``L12N345``
(neuron), each optionally ``@POS`` for one position. Receivers: ``L12H3.q`` / ``.k`` / ``.v``
(on GQA models the KV head of query head 3 for k/v), ``MLP12``, ``resid12`` (the residual
entering block 12; ``resid12@POS`` and ``resid12@POS:CHANNEL``) and ``metric``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from mechsink.bridge import n_kv_heads, run_from_layer, token_strings, write_in_place
from mechsink.errors import BadInputError
from mechsink.patching.activation import (
    TokensLike,
    as_tokens,
    check_pair,
    outputs_on,
    resolve_needs,
    run_stacked,
)
from mechsink.patching.metrics import Metric, as_metric, check_value
from mechsink.patching.result import PatchResult

HookFn = Callable[..., Any]

_COMP = re.compile(
    r"^(?:(?P<embed>embed)|L(?P<hl>\d+)H(?P<h>\d+)|MLP(?P<ml>\d+)|L(?P<nl>\d+)N(?P<n>\d+))"
    r"(?:@(?P<pos>-?\d+))?$"
)
_RECV = re.compile(
    r"^(?:(?P<metric>metric)|L(?P<hl>\d+)H(?P<h>\d+)\.(?P<qkv>[qkv])|MLP(?P<ml>\d+)"
    r"|resid(?P<rl>\d+)(?:@(?P<pos>-?\d+)(?::(?P<ch>\d+))?)?)$"
)


@dataclass(frozen=True)
class Component:
    """A sender: ``kind`` in embed/head/mlp/neuron, its layer, head or neuron, optional pos."""

    kind: str
    layer: int = 0
    index: int = 0
    pos: int | None = None


@dataclass(frozen=True)
class Receiver:
    """A receiver: ``kind`` in metric/q/k/v/mlp/resid, layer, head, pos and channel."""

    kind: str
    layer: int = 0
    head: int = 0
    pos: int | None = None
    channel: int | None = None


def parse_component(spec: str | Component) -> Component:
    """A :class:`Component` from ``embed``, ``L12H3``, ``MLP7``, ``L4N301`` (+ ``@pos``)."""
    if isinstance(spec, Component):
        return spec
    m = _COMP.match(spec.strip())
    if m is None:
        raise BadInputError(
            f"unknown sender {spec!r}: write embed, L<layer>H<head>, MLP<layer> or "
            "L<layer>N<neuron>, optionally followed by @<pos>."
        )
    pos = None if m["pos"] is None else int(m["pos"])
    if m["embed"]:
        return Component("embed", pos=pos)
    if m["hl"] is not None:
        return Component("head", int(m["hl"]), int(m["h"]), pos)
    if m["ml"] is not None:
        return Component("mlp", int(m["ml"]), 0, pos)
    return Component("neuron", int(m["nl"]), int(m["n"]), pos)


def parse_receiver(spec: str | Receiver) -> Receiver:
    """A :class:`Receiver` from ``metric``, ``L12H3.q``, ``MLP7``, ``resid9@0:123``."""
    if isinstance(spec, Receiver):
        return spec
    m = _RECV.match(spec.strip())
    if m is None:
        raise BadInputError(
            f"unknown receiver {spec!r}: write metric, L<layer>H<head>.q|k|v, MLP<layer> or "
            "resid<layer>[@pos[:channel]]."
        )
    if m["metric"]:
        return Receiver("metric")
    if m["hl"] is not None:
        return Receiver(m["qkv"], int(m["hl"]), int(m["h"]))
    if m["ml"] is not None:
        return Receiver("mlp", int(m["ml"]))
    pos = None if m["pos"] is None else int(m["pos"])
    ch = None if m["ch"] is None else int(m["ch"])
    return Receiver("resid", int(m["rl"]), 0, pos, ch)


def _check(model: Any, c: Component | Receiver, seq_len: int) -> None:
    cfg = model.cfg
    n_layers, n_heads = int(cfg.n_layers), int(cfg.n_heads)

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise BadInputError(f"{c}: {what} is out of range for this model/prompt.")

    if c.kind != "metric":
        need(0 <= c.layer < n_layers, f"layer {c.layer}")
    if c.kind in ("head", "q", "k", "v"):
        idx = c.index if isinstance(c, Component) else c.head
        need(0 <= idx < n_heads, f"head {idx}")
    if c.kind == "neuron":
        need(0 <= c.index < int(cfg.d_mlp or 0), f"neuron {c.index}")
    if c.pos is not None:
        need(-seq_len <= c.pos < seq_len, f"position {c.pos}")
    if isinstance(c, Receiver) and c.channel is not None:
        need(0 <= c.channel < int(cfg.d_model), f"channel {c.channel}")


def path_patch(
    model: Any,
    clean: TokensLike,
    corrupted: TokensLike | None,
    senders: Sequence[str | Component | Sequence[str | Component]],
    receivers: Sequence[str | Receiver],
    metric: Metric | Callable[[Tensor], Tensor],
    *,
    ablation: str | None = None,
    scales: str = "recomputed",
    batch_size: int = 16,
    prepend_bos: bool = True,
) -> PatchResult:
    """Path-patch each sender (or group of senders) to ``receivers``; one value per entry.

    Returns a :class:`PatchResult` with axis ``sender``; ``clean_value``/``corrupted_value``
    are the metric on the unpatched runs (``corrupted_value`` is None under ``ablation``).
    """
    if scales not in ("recomputed", "frozen"):
        raise BadInputError(f"scales must be 'recomputed' or 'frozen', got {scales!r}.")
    if ablation not in ABLATIONS:
        raise BadInputError(f"ablation must be one of {ABLATIONS[1:]} or None, got {ablation!r}.")
    if (ablation is None) == (corrupted is None):
        raise BadInputError("give either a corrupted input or an ablation (corrupted=None), "
                            "not both and not neither.")
    if not senders:
        raise BadInputError("no senders given.")
    clean_t = as_tokens(model, clean, prepend_bos=prepend_bos)
    corr_t = None if corrupted is None else as_tokens(model, corrupted, prepend_bos=prepend_bos)
    if corr_t is not None:
        check_pair(clean_t, corr_t)
    if ablation == "position_mean" and clean_t.shape[1] < 2:
        raise BadInputError("position_mean ablation needs at least 2 positions.")
    b0, seq_len = clean_t.shape
    groups = [[parse_component(s)] if isinstance(s, (str, Component)) else
              [parse_component(x) for x in s] for s in senders]
    recvs = [parse_receiver(r) for r in receivers]
    if not recvs:
        raise BadInputError("no receivers given: pass e.g. ['metric'] or ['L5H1.v'].")
    for c in [c for g in groups for c in g] + recvs:
        _check(model, c, seq_len)
    to_metric = any(r.kind == "metric" for r in recvs)
    if to_metric and len(recvs) > 1:
        raise BadInputError("'metric' as a receiver cannot be combined with other receivers.")
    metric = as_metric(metric)
    needs = resolve_needs(model, metric, seq_len)

    with torch.no_grad():
        clean_out = outputs_on(model, clean_t, needs)
        metric = metric.bind(clean_out)
        clean_value = check_value(metric(clean_out), "on the clean run")
        _, cc = model.run_with_cache(clean_t)
        if corr_t is None:
            corr_value, cx = None, AblatedActivations(cc, ablation)
        else:
            corr_value = check_value(metric(outputs_on(model, corr_t, needs)),
                                     "on the corrupted run")
            _, cx = model.run_with_cache(corr_t)
        values = []
        for lo in range(0, len(groups), batch_size):
            chunk = groups[lo:lo + batch_size]
            freeze = _freeze_hooks(model, chunk, cc, cx, b0, seq_len, scales)
            resid0 = _embed_rows(chunk, cc, cx, b0, seq_len)
            if to_metric:
                values += run_stacked(model, resid0, 0, len(chunk), freeze, metric, needs,
                                      upstream=cc.cache_dict, stacked=True,
                                      where="on the path-patched run")
                continue
            recorded: dict[str, Tensor] = {}
            names = [_recv_hook(r) for r in recvs]
            rec = [(h, _recorder(recorded, h)) for h in dict.fromkeys(names)]
            # record before freezing: recorders registered first see the computed values
            run_from_layer(model, resid0, 0, fwd_hooks=rec + freeze, stop_after=set(names))
            start = min(r.layer for r in recvs)
            patch = [(h, _receiver_patch(model, r, recorded[h], len(chunk), b0, seq_len))
                     for r, h in zip(recvs, names, strict=True)]
            values += run_stacked(model, cc[f"blocks.{start}.hook_resid_pre"], start,
                                  len(chunk), patch, metric, needs,
                                  upstream=cc.cache_dict, where="on the receiver run")
    labels = ["+".join(_name(c) for c in g) for g in groups]
    return PatchResult(
        values=torch.stack(values), axes=("sender",), labels={"sender": labels},
        site="path:" + ",".join(_rname(r) for r in recvs), metric=metric.name,
        clean_value=float(clean_value),
        corrupted_value=None if corr_value is None else float(corr_value),
        tokens=token_strings(model, clean_t[0]),
        meta={"scales": scales, "direction": "noise", "ablation": ablation},
    )


ABLATIONS = (None, "zero", "mean", "position_mean")


class AblatedActivations(Mapping):
    """The clean run's activations, ablated on read: the "corrupted run" of an ablation."""

    def __init__(self, clean: Any, ablation: str) -> None:
        self.clean, self.ablation, self._done = clean, ablation, {}

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._done:
            act = self.clean[name]
            if self.ablation == "zero":
                new = torch.zeros_like(act)
            elif self.ablation == "mean":
                new = act.mean(0, keepdim=True).expand_as(act)
            else:  # position_mean: positions 1.. of the same sequence
                new = act[:, 1:].mean(1, keepdim=True).expand_as(act)
            self._done[name] = new
        return self._done[name]

    def __iter__(self) -> Any:
        return iter(self.clean.cache_dict)

    def __len__(self) -> int:
        return len(self.clean.cache_dict)


def _name(c: Component) -> str:
    base = {"embed": "embed", "head": f"L{c.layer}H{c.index}", "mlp": f"MLP{c.layer}",
            "neuron": f"L{c.layer}N{c.index}"}[c.kind]
    return base if c.pos is None else f"{base}@{c.pos}"


def _rname(r: Receiver) -> str:
    if r.kind == "metric":
        return "metric"
    if r.kind in "qkv":
        return f"L{r.layer}H{r.head}.{r.kind}"
    if r.kind == "mlp":
        return f"MLP{r.layer}"
    tail = "" if r.pos is None else f"@{r.pos}" + ("" if r.channel is None else f":{r.channel}")
    return f"resid{r.layer}{tail}"


def _recv_hook(r: Receiver) -> str:
    if r.kind in ("q", "k", "v"):
        return f"blocks.{r.layer}.attn.hook_{r.kind}"
    if r.kind == "mlp":
        return f"blocks.{r.layer}.hook_mlp_out"
    return f"blocks.{r.layer}.hook_resid_pre"


def _recorder(store: dict[str, Tensor], name: str) -> HookFn:
    def hook(act: Tensor, hook: Any) -> None:
        store[name] = act.clone()

    return hook


def _pos_index(pos: int | None, seq_len: int) -> Any:
    return slice(None) if pos is None else (pos + seq_len if pos < 0 else pos)


def _receiver_patch(
    model: Any, r: Receiver, recorded: Tensor, n: int, b0: int, seq_len: int
) -> HookFn:
    """Overwrite the receiver's slice with its value from the sender run (per stacked copy)."""
    p = _pos_index(r.pos, seq_len)
    if r.kind in ("q", "k", "v"):
        head = r.head if r.kind == "q" else r.head // (int(model.cfg.n_heads) // n_kv_heads(model))
        index: tuple[Any, ...] = (slice(None), p, head)
    elif r.kind == "mlp":
        index = (slice(None), p)
    else:
        index = (slice(None), p) if r.channel is None else (slice(None), p, r.channel)

    def hook(act: Tensor, hook: Any) -> Tensor:
        new = act.clone()
        new[index] = recorded[index]
        return write_in_place(act, new)

    return hook


def _rows_mask(flags: list[bool], b0: int) -> Tensor:
    return torch.tensor(flags).repeat_interleave(b0)


def _embed_rows(chunk: list[list[Component]], cc: Any, cx: Any, b0: int, seq_len: int) -> Tensor:
    """Residual entering block 0 per stacked copy: corrupted embedding where it is a sender."""
    clean0, corr0 = cc["blocks.0.hook_resid_pre"], cx["blocks.0.hook_resid_pre"]
    rows = []
    for group in chunk:
        r = clean0.clone()
        for c in group:
            if c.kind == "embed":
                p = _pos_index(c.pos, seq_len)
                r[:, p] = corr0[:, p]
        rows.append(r)
    return torch.cat(rows)


def _freeze_hooks(
    model: Any, chunk: list[list[Component]], cc: Any, cx: Any, b0: int, seq_len: int,
    scales: str,
) -> list[tuple[str, HookFn]]:
    """Hooks that put senders at corrupted values and freeze every other component at clean."""
    n = len(chunk)
    hooks: list[tuple[str, HookFn]] = []
    n_heads = int(model.cfg.n_heads)
    for layer in range(int(model.cfg.n_layers)):
        # heads: clean z everywhere except the senders' (head, pos) in their copy
        z = f"blocks.{layer}.attn.hook_z"
        mask = torch.zeros(n, 1, seq_len, n_heads, 1, dtype=torch.bool)
        for i, g in enumerate(chunk):
            for c in g:
                if c.kind == "head" and c.layer == layer:
                    mask[i, :, _pos_index(c.pos, seq_len), c.index] = True
        hooks.append((z, _mix(mask, cc[z], cx[z], n)))
        # neurons: in copies with a neuron sender here, other neurons frozen clean
        post = f"blocks.{layer}.mlp.hook_post"
        has_neuron = [any(c.kind == "neuron" and c.layer == layer for c in g) for g in chunk]
        if any(has_neuron):
            d_mlp = cc[post].shape[-1]
            nmask = torch.zeros(n, 1, seq_len, d_mlp, dtype=torch.bool)
            keep = torch.ones(n, 1, seq_len, d_mlp, dtype=torch.bool)
            for i, g in enumerate(chunk):
                if has_neuron[i]:
                    keep[i] = False
                for c in g:
                    if c.kind == "neuron" and c.layer == layer:
                        nmask[i, :, _pos_index(c.pos, seq_len), c.index] = True
            hooks.append((post, _mix3(keep, nmask, cc[post], cx[post], n)))
        # MLP output: corrupted for MLP senders, recomputed for neuron senders, else clean
        out = f"blocks.{layer}.hook_mlp_out"
        keep = torch.zeros(n, 1, seq_len, 1, dtype=torch.bool)
        mmask = torch.zeros(n, 1, seq_len, 1, dtype=torch.bool)
        for i, g in enumerate(chunk):
            if has_neuron[i]:
                keep[i] = True
            for c in g:
                if c.kind == "mlp" and c.layer == layer:
                    mmask[i, :, _pos_index(c.pos, seq_len)] = True
        hooks.append((out, _mix3(keep, mmask, cc[out], cx[out], n)))
    if scales == "frozen":
        names = [f"blocks.{layer}.{ln}.hook_scale" for layer in range(int(model.cfg.n_layers))
                 for ln in ("ln1", "ln2")] + ["ln_final.hook_scale"]
        for name in names:
            if name in cc.cache_dict:
                hooks.append((name, _const(cc[name], n)))
    return hooks


def _mix(mask: Tensor, clean: Tensor, corr: Tensor, n: int) -> HookFn:
    """Copy i of the batch gets ``corr`` where ``mask[i]``, ``clean`` elsewhere."""

    def hook(act: Tensor, hook: Any) -> Tensor:
        new = torch.where(mask, corr.unsqueeze(0), clean.unsqueeze(0)).reshape(act.shape)
        return write_in_place(act, new.to(act.dtype))

    return hook


def _mix3(keep: Tensor, mask: Tensor, clean: Tensor, corr: Tensor, n: int) -> HookFn:
    """Like :func:`_mix`, but where ``keep`` is True the computed value stays."""

    def hook(act: Tensor, hook: Any) -> Tensor:
        view = act.reshape(n, -1, *act.shape[1:])
        base = torch.where(mask, corr.unsqueeze(0), clean.unsqueeze(0))
        new = torch.where(keep & ~mask, view, base).reshape(act.shape)
        return write_in_place(act, new.to(act.dtype))

    return hook


def _const(value: Tensor, n: int) -> HookFn:
    def hook(act: Tensor, hook: Any) -> Tensor:
        return write_in_place(act, value.repeat(n, *[1] * (value.ndim - 1)).to(act.dtype))

    return hook
