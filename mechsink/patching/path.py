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

Ablation instead of a corrupted input (``ablation=``, with ``corrupted=None``; the vocabulary
of :mod:`mechsink.interventions.ablation`): each sender's value is ``"zero"``, its ``"batch_mean"``
over the clean batch, ``"resample"`` (sequences of the clean batch) or its ``"position_mean"``: the
mean over the positions of the same sequence the sender does not cover (``@0``: positions 1..), i.e.
the value an ordinary position has. The last one asks "what does this component's *position-0*
output do", the question of the P0-sink circuit (Peng, Li et al. 2026, "How Attention Sinks
Emerge in Large Language Models: An Interpretability Perspective"), where no corrupted text
makes position 0 ordinary (the sink does not depend on the first token).

Direction (``direction=``): ``"noise"`` (the default, as in ARENA's statement) runs the clean
input with the senders' corrupted (or ablated) outputs; ``"denoise"`` runs the corrupted input
with the senders' clean outputs and every other component frozen at its corrupted value.

Senders and receivers (:mod:`mechsink.patching.nodes`) are named in :mod:`mechsink.names`'s
vocabulary (any number of digits; TransformerLens hook names work too). Senders: ``embed``
(the residual entering block 0), ``L12H3`` (head), ``MLP12``, ``L12N345`` (neuron), ``ATTN12``
or ``blocks.12.attn.hook_z`` (every head of block 12 together), ``blocks.12.hook_mlp_out``,
each optionally ``@POS``. Receivers: ``L12H3.q`` / ``.k`` / ``.v`` (on GQA models the KV head
of query head 3 for k/v; ``L12KV1.k`` names KV head 1 itself; ``blocks.12.attn.hook_k`` for
every head), ``MLP12``, ``resid12`` (the residual entering block 12; ``resid12@POS`` and
``resid12@POS:CHANNEL``; ``blocks.12.hook_resid_pre``) and ``metric``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.ablation import Ablation, as_ablation
from mechsink.model import (
    act_name,
    hook_names,
    run_from_layer,
    scale_edits_expected,
    token_strings,
    write_in_place,
)
from mechsink.model.memory import check_budget
from mechsink.model.support import check_supported
from mechsink.names import Name, explicit_bos
from mechsink.patching import checks, engine, plan
from mechsink.patching.engine import TokensLike
from mechsink.patching.metrics import Metric
from mechsink.patching.nodes import (
    Receiver,
    Sender,
    parse_component,
    parse_receiver,
    sender_group,
)
from mechsink.patching.result import PatchResult

HookFn = Callable[..., Any]
MetricLike = Metric | Callable[[Tensor], Tensor] | str  # str: a metric string (the CLI form)
__all__ = ["SenderValues", "parse_component", "parse_receiver", "path_patch"]


def path_patch(
    model: Any,
    clean: TokensLike,
    corrupted: TokensLike | None,
    senders: Sequence[str | Sender | Sequence[str | Sender]],
    receivers: Sequence[str | Receiver],
    metric: MetricLike | Sequence[MetricLike],
    *,
    direction: str = "noise",
    ablation: str | Ablation | None = None,
    scales: str = "recomputed",
    batch_size: int | None = 16,
    memory_budget: int | str | None = None,
    prepend_bos: bool | None = None,
    seed: int = 0,
) -> PatchResult | list[PatchResult]:
    """Path-patch each sender (or group of senders) to ``receivers``; one value per entry.

    Returns a :class:`PatchResult` with axis ``sender``; ``clean_value``/``corrupted_value``
    are the metric on the unpatched runs (``corrupted_value`` is None under ``ablation``).
    Several metrics (a list) share every forward and give a list of results, one per metric.
    ``direction``: ``"noise"`` (run clean, senders from corrupted/ablated; ARENA's path
    patching) or ``"denoise"`` (run corrupted, senders from clean; needs a corrupted input).
    ``prepend_bos``: whether text inputs get BOS at position 0 (required for text; token
    tensors are used as they are).
    ``ablation`` (:mod:`mechsink.interventions.ablation`, with ``corrupted=None``): ``"zero"``,
    ``"batch_mean"`` over the clean batch, ``"position_mean"`` (the mean over the positions
    the sender does not cover, so a sender needs ``@pos``) or ``"resample"`` (rows of the
    clean batch drawn with ``seed``). ``batch_size``: sender groups per forward (None: as
    many as ``memory_budget`` allows).
    """
    check_supported(model, "path")
    checks.check_inputs("path_patch", "path_patch(model, clean, corrupted or None, senders, "
                        "receivers, metric, *, direction=..., ...)", clean=clean,
                        corrupted=corrupted)
    if direction not in ("noise", "denoise"):
        raise BadInputError(f"direction must be 'noise' or 'denoise', got {direction!r}.")
    if direction == "denoise" and corrupted is None:
        raise BadInputError("direction='denoise' runs the corrupted input: give one (an "
                            "ablation replaces senders on the clean run: direction='noise').")
    prepend_bos = explicit_bos(prepend_bos, clean, corrupted, where="path_patch")
    if scales not in ("recomputed", "frozen"):
        raise BadInputError(f"scales must be 'recomputed' or 'frozen', got {scales!r}.")
    abl = as_ablation(ablation, seed=seed)
    if (abl is None) == (corrupted is None):
        raise BadInputError("give either a corrupted input or an ablation (corrupted=None), "
                            "not both and not neither.")
    engine.check_batch_size(batch_size)
    if memory_budget is not None:
        memory_budget = check_budget(memory_budget)  # before any forward
    clean_t = engine.as_tokens(model, clean, prepend_bos=prepend_bos)
    groups, recvs = _nodes(model, senders, receivers, abl, clean_t.shape[1])
    names = _cached_names(model, groups, recvs, scales)
    keep = {"clean": names} if corrupted is None else {"clean": names, "corrupted": names}
    with torch.no_grad():
        s = engine.setup(model, clean_t, corrupted, metric, prepend_bos=prepend_bos, keep=keep)
        per_batch = batch_size or plan.copies_per_batch(
            model, s.batch, s.seq_len, 0, plan.logit_positions(s.needs),
            memory_budget=memory_budget)
        values = _sweep(model, s, groups, recvs, direction, abl, scales, per_batch)
    labels = ["+".join(c.name for c in g) for g in groups]
    results = [PatchResult(
        values=torch.stack([vals[i] for i in range(len(groups))]), axes=("sender",),
        labels={"sender": labels},
        site="path:" + ",".join(r.name for r in recvs), metric=m.name,
        clean_value=float(cv), corrupted_value=None if xv is None else float(xv),
        tokens=token_strings(model, clean_t[0]),
        meta={"scales": scales, "direction": direction,
              "ablation": None if abl is None else str(abl)},
    ) for m, vals, cv, xv in zip(s.metrics, values, s.clean_values, s.corrupted_values,
                                 strict=True)]
    return results if isinstance(metric, (list, tuple)) else results[0]


def _nodes(
    model: Any, senders: Sequence[Any], receivers: Sequence[Any], abl: Ablation | None,
    seq_len: int,
) -> tuple[list[list[Sender]], list[Receiver]]:
    """The sender groups and receivers, checked against the model and prompt."""
    if not senders:
        raise BadInputError("no senders given.")
    n_heads = int(model.cfg.n_heads)
    groups = [sender_group(s, n_heads) if isinstance(s, (str, Sender, Name)) else
              [c for x in s for c in sender_group(x, n_heads)] for s in senders]
    recvs = [parse_receiver(r) for r in receivers]
    if not recvs:
        raise BadInputError("no receivers given: pass e.g. ['metric'] or ['L5H1.v'].")
    if any(r.kind == "metric" for r in recvs) and len(recvs) > 1:
        raise BadInputError("'metric' as a receiver cannot be combined with other receivers.")
    for c in [c for g in groups for c in g] + recvs:
        c.check(model, seq_len)
    if abl is not None and abl.kind == "position_mean":
        whole = sorted({c.name for g in groups for c in g if c.position is None})
        if whole or seq_len < 2:
            raise BadInputError(
                "position_mean ablation replaces a sender's output at its position by the mean "
                f"over the other positions: give each sender a position (e.g. {whole[0]}@0)"
                if whole else "position_mean ablation needs at least 2 positions.")
    return groups, recvs


def _sweep(
    model: Any, s: engine.Setup, groups: list[list[Sender]], recvs: list[Receiver],
    direction: str, abl: Ablation | None, scales: str, per_batch: int,
) -> list[dict[int, Tensor]]:
    """Per metric, the path-patched value of each sender group (by its number)."""
    base, source = (s.clean, s.corrupted) if direction == "noise" else (s.corrupted, s.clean)
    assert base is not None
    clean_acts = base.acts  # the run's own activations (clean, or corrupted to denoise)
    sender_source = SenderValues(clean_acts, None if source is None else source.acts, abl)
    last_start = min((r.layer for r in recvs if r.layer is not None), default=None)
    values: list[dict[int, Tensor]] = [{} for _ in s.metrics]
    with engine.progress(len(groups), "path patching") as bar, scale_edits_expected():
        for ids, joins, p in _batches(model, base, groups, last_start, per_batch):
            chunk = [groups[i] for i in ids]
            freeze = _freeze_hooks(model, chunk, clean_acts, sender_source, s.seq_len, scales,
                                   p)
            start = joins[0]
            n_start = joins.count(start)
            if start == 0:
                resid = _embed_rows(chunk[:n_start], clean_acts, sender_source, s.seq_len)
            else:
                resid = clean_acts[act_name("resid_pre", start)].repeat(n_start, 1, 1)
            if last_start is None:  # the receiver is the metric: the senders' direct effect
                stair = len(set(joins)) > 1
                got = engine.run_patched(
                    model, base, s.metrics, s.needs, resid[:base.batch] if stair else resid,
                    start, len(chunk), freeze, stacked=not stair, first=p,
                    joins=joins if stair else None, context="on the path-patched run")
            else:
                got = _through_receivers(model, s, base, recvs, len(chunk), freeze, resid,
                                         joins, p)
            for j, vals in enumerate(got):
                values[j].update(zip(ids, vals, strict=True))
            bar.update(len(chunk))
    return values


def _batches(model: Any, base: engine.Run, groups: list[list[Sender]],
             last_start: int | None, per_batch: int
             ) -> list[tuple[list[int], list[int], int]]:
    """Sender groups in forwards: ``(group numbers, the block each joins at, the first
    position computed)``.

    Groups are sorted by the first block they touch (capped at the first receiver's layer:
    a receiver must see every copy). On the staircase (:func:`mechsink.patching.plan.
    staircase`: the model's batch may grow mid-forward) each copy joins the forward at its
    own block, so a copy of a late sender never recomputes the blocks before it; otherwise a
    batch starts at its earliest group's block. Prefix reuse: a batch whose senders all sit at
    positions ``>= p`` computes positions ``p..`` only (the rest is the base run's, keys and
    values included). A direct-effect batch holding an embedding sender starts every copy at
    block 0 (its rows differ per copy)."""
    def block(g: list[Sender]) -> int:
        b = _first_block(g)
        return b if last_start is None else min(b, last_start)

    def first_pos(g: list[Sender]) -> int:
        pos = [_pos_index(c.position, base.seq_len) for c in g]
        return 0 if any(isinstance(q, slice) for q in pos) else min(pos)

    order = sorted(range(len(groups)), key=lambda i: block(groups[i]))
    stair = plan.staircase(model)
    out = []
    for lo in range(0, len(order), per_batch):
        ids = order[lo:lo + per_batch]
        joins = [block(groups[i]) for i in ids]
        embed = any(c.kind == "embed" for i in ids for c in groups[i])
        if not stair or (last_start is None and embed):
            joins = [joins[0]] * len(ids)
        p = engine.reused_prefix(base, min(first_pos(groups[i]) for i in ids))
        out.append((ids, joins, p))
    return out


def _through_receivers(
    model: Any, s: engine.Setup, base: engine.Run, recvs: list[Receiver], n: int,
    freeze: list[tuple[str, HookFn]], resid: Tensor, joins: list[int], p: int,
) -> list[list[Tensor]]:
    """Step 1 (record the receivers' inputs on the sender run, copy ``i`` joining at block
    ``joins[i]``, positions ``p..``) and step 2 (the ``base`` run with only those inputs
    replaced), for one batch of ``n`` sender groups."""
    recorded: dict[str, Tensor] = {}
    hooks = [r.hook for r in recvs]
    rec = [(h, _recorder(recorded, h)) for h in dict.fromkeys(hooks)]
    start = joins[0]
    grow = engine.growth_hooks(base, joins, start, p)
    prefix: Any = None
    if p:
        counts = [sum(j <= layer for j in joins) for layer in range(int(model.cfg.n_layers))]
        prefix = (base.kv, p) if not grow else (base.kv, p, counts)
    # record before freezing: recorders registered first see the computed values
    run_from_layer(model, resid[:, p:], start, fwd_hooks=grow + rec + freeze,
                   stop_after=set(hooks), prefix=prefix)
    start = min(r.layer for r in recvs if r.layer is not None)
    patch = [(h, _receiver_patch(model, r, recorded[h], s.seq_len, p))
             for r, h in zip(recvs, hooks, strict=True)]
    return engine.run_patched(model, base, s.metrics, s.needs,
                              base.acts[act_name("resid_pre", start)], start, n,
                              patch, first=p, context="on the receiver run")


def _first_block(group: list[Sender]) -> int:
    """The first block a sender group changes (0 for the embedding)."""
    return min(c.block for c in group)


def _cached_names(
    model: Any, groups: list[list[Sender]], recvs: list[Receiver], scales: str
) -> set[str]:
    """Activations path patching reads from the clean (and corrupted) run."""
    n_layers = int(model.cfg.n_layers)
    names = {act_name("resid_pre", layer) for layer in range(n_layers)}
    for layer in range(n_layers):  # what every head and MLP computes: frozen or sent
        names |= {Sender("head", layer).hook, Sender("mlp", layer).hook}
    names |= {c.hook for g in groups for c in g if c.kind == "neuron"}
    if scales == "frozen":
        known = hook_names(model)
        names |= {n for n in _scale_names(model) if n in known}
    return names


def _scale_names(model: Any) -> list[str]:
    return [act_name(f"{ln}.hook_scale", layer) for layer in range(int(model.cfg.n_layers))
            for ln in ("ln1", "ln2")] + ["ln_final.hook_scale"]


class SenderValues:
    """What a sender's output becomes: the corrupted run's value, or the clean run's ablated
    (:class:`~mechsink.interventions.ablation.Ablation`; position_mean over the positions it leaves
    alone)."""

    def __init__(self, clean: dict[str, Tensor], corrupted: dict[str, Tensor] | None,
                 ablation: Ablation | None) -> None:
        self.clean, self.corrupted, self.ablation = clean, corrupted, ablation

    def __call__(self, name: str, pos: int | None, seq_len: int) -> Tensor:
        """The full ``[batch, pos, ...]`` sender value of hook ``name`` (use it at ``pos``)."""
        if self.corrupted is not None:
            return self.corrupted[name]
        assert self.ablation is not None
        ablated = torch.zeros(seq_len, dtype=torch.bool)
        ablated[_pos_index(pos, seq_len)] = True
        return self.ablation.values(self.clean[name], ablated)


def _recorder(store: dict[str, Tensor], name: str) -> HookFn:
    def hook(act: Tensor, hook: Any) -> None:
        store[name] = act.clone()

    return hook


def _pos_index(pos: int | None, seq_len: int) -> Any:
    return slice(None) if pos is None else (pos + seq_len if pos < 0 else pos)


def _receiver_patch(model: Any, r: Receiver, recorded: Tensor, seq_len: int,
                    p: int = 0) -> HookFn:
    """Overwrite the receiver's slice with its value from the sender run (per stacked copy);
    both runs compute positions ``p..`` (a receiver position before ``p`` is unchanged)."""
    pos = _pos_index(r.position, seq_len)
    if isinstance(pos, int):
        if pos < p:
            return lambda act, hook: None
        pos -= p
    unit = r.index_on(model)  # q: the head; k/v: the KV head; resid: the channel
    if r.kind == "mlp" or unit is None:
        index: tuple[Any, ...] = (slice(None), pos)
    else:
        index = (slice(None), pos, unit)

    def hook(act: Tensor, hook: Any) -> Tensor:
        new = act.clone()
        new[index] = recorded[index]
        return write_in_place(act, new)

    return hook


def _embed_rows(
    chunk: list[list[Sender]], clean: dict[str, Tensor], sender_value: SenderValues,
    seq_len: int,
) -> Tensor:
    """Residual entering block 0 per stacked copy: the sender value where ``embed`` sends."""
    name = act_name("resid_pre", 0)
    rows = []
    for group in chunk:
        row = clean[name].clone()
        for c in group:
            if c.kind == "embed":
                p = _pos_index(c.position, seq_len)
                row[:, p] = sender_value(name, c.position, seq_len)[:, p]
        rows.append(row)
    return torch.cat(rows)


def _stack(
    name: str, chunk: list[list[Sender]], kind: str, layer: int, clean: dict[str, Tensor],
    sender_value: SenderValues, seq_len: int,
) -> tuple[Tensor, Tensor] | None:
    """Per copy: the clean activation with the senders' values written in, and where they
    are (``[copies, batch, ...]`` and a bool mask of the same layout, batch axis 1); None
    when no sender of this chunk sits here."""
    if not any(c.kind == kind and c.layer == layer for g in chunk for c in g):
        return None
    act = clean[name]
    base = act.unsqueeze(0).repeat(len(chunk), *[1] * act.ndim)
    where_sent = torch.zeros(len(chunk), 1, *act.shape[1:], dtype=torch.bool)
    for i, group in enumerate(chunk):
        for c in group:
            if c.kind != kind or c.layer != layer:
                continue
            p = _pos_index(c.position, seq_len)
            index: tuple[Any, ...] = (slice(None), p) if kind == "mlp" else (
                slice(None), p, c.index)
            base[i][index] = sender_value(name, c.position, seq_len)[index]
            where_sent[i][index] = True
    return base, where_sent


def _freeze_hooks(
    model: Any, chunk: list[list[Sender]], clean: dict[str, Tensor],
    sender_value: SenderValues, seq_len: int, scales: str, p: int = 0,
) -> list[tuple[str, HookFn]]:
    """Hooks that put senders at their sender values and freeze every other component at its
    clean value (a neuron sender's MLP output is recomputed from the frozen neurons); they
    see positions ``p..`` and, on the staircase, the copies present so far (a prefix)."""
    n = len(chunk)
    hooks: list[tuple[str, HookFn]] = []
    for layer in range(int(model.cfg.n_layers)):
        z = Sender("head", layer).hook
        stacked = _stack(z, chunk, "head", layer, clean, sender_value, seq_len)
        hooks.append((z, _mix(None, stacked[0] if stacked else None, clean[z], p)))
        # neurons: in copies with a neuron sender here, the other neurons are frozen clean
        has_neuron = torch.tensor([any(c.kind == "neuron" and c.layer == layer for c in g)
                                   for g in chunk])
        post = Sender("neuron", layer).hook
        if bool(has_neuron.any()):
            stacked = _stack(post, chunk, "neuron", layer, clean, sender_value, seq_len)
            assert stacked is not None
            keep = (~has_neuron).reshape(n, *[1] * clean[post].ndim)
            hooks.append((post, _mix(keep, stacked[0], clean[post], p)))
        # MLP output: the sender value for MLP senders, recomputed for neuron senders, else clean
        out = Sender("mlp", layer).hook
        stacked = _stack(out, chunk, "mlp", layer, clean, sender_value, seq_len)
        keep = has_neuron.reshape(n, *[1] * clean[out].ndim)
        if stacked is not None:
            keep = keep & ~stacked[1]
        hooks.append((out, _mix(keep if bool(has_neuron.any()) else None,
                                stacked[0] if stacked else None, clean[out], p)))
    if scales == "frozen":
        for name in _scale_names(model):
            if name in clean:
                hooks.append((name, _mix(None, None, clean[name], p)))
    return hooks


def _mix(keep: Tensor | None, stacked: Tensor | None, clean: Tensor, p: int = 0) -> HookFn:
    """Copy ``i`` gets ``stacked[i]`` (or ``clean`` when None), except where ``keep`` is True,
    where the computed value stays; positions ``p..`` only, and the first ``rows / batch``
    copies (those present in a growing batch). The value returned is contiguous: with a batch
    of one the broadcast clean value reshapes to a stride-0 view, which transformers'
    ``Conv1D`` (GPT-2's ``c_proj`` reads ``hook_post``) cannot ``view``."""
    seq_len = clean.shape[1]
    keep = None if keep is None else keep.to(clean.device)  # built on the CPU
    if p:  # [batch, pos, ...] / [copies, batch or 1, pos or 1, ...]: drop positions < p
        clean = clean[:, p:]
        stacked = None if stacked is None else stacked[:, :, p:]
        keep = None if keep is None or keep.shape[2] != seq_len else keep[:, :, p:]

    def hook(act: Tensor, hook: Any) -> Tensor:
        m = act.shape[0] // clean.shape[0]  # the copies present (all but on the staircase)
        base = clean.unsqueeze(0).expand(m, *clean.shape) if stacked is None else stacked[:m]
        if keep is None:
            new = base.reshape(act.shape)
        else:
            view = act.reshape(m, -1, *act.shape[1:])
            new = torch.where(keep[:m], view, base).reshape(act.shape)
        return write_in_place(act, new.to(act.dtype).contiguous())

    return hook
