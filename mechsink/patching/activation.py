"""Exact, batched activation patching (and zero / batch-mean / position-mean / resample ablation).

Built on :mod:`mechsink.patching.engine`: each patched forward starts at the patched layer,
recomputes only the positions from the earliest patched one (prefix reuse), stacks many patches
per batch and stops after what the metric reads. Results equal
``transformer_lens.patching.get_act_patch_*`` (see tests/test_patching.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.ablation import Ablation, as_ablation
from mechsink.model import act_name, write_in_place
from mechsink.names import Name, explicit_bos
from mechsink.patching import checks, engine
from mechsink.patching.engine import (  # noqa: F401  (re-exported for older imports)
    DEFAULT_TOKENS_PER_BATCH,
    SPEEDUPS,
    TokensLike,
    as_tokens,
    check_pair,
    outputs_on,
    resolve_needs,
)
from mechsink.patching.metrics import ALL, Metric
from mechsink.patching.result import PatchResult
from mechsink.patching.sites import Site, parse_site

HookFn = Callable[..., Any]
SIGNATURE = "activation_patch(model, clean, corrupted, site, metric, *, direction=..., ...)"


def activation_patch(
    model: Any,
    clean: TokensLike,
    corrupted: TokensLike,
    site: str | tuple[str, int] | Name | Site,
    metric: Metric | Callable[[Tensor], Tensor],
    *,
    direction: str = "denoise",
    ablation: str | Ablation | None = None,
    reference: TokensLike | None = None,
    batch_size: int | None = None,
    memory_budget: int | None = None,
    normalize: bool = False,
    prepend_bos: bool | None = None,
    seed: int = 0,
) -> PatchResult:
    """Patch every unit of ``site`` and record ``metric``; exact, batched.

    ``direction="denoise"`` runs the corrupted input and patches in clean activations (what
    ``transformer_lens.patching`` does); ``"noise"`` runs clean and patches in corrupted ones.
    ``ablation`` (:mod:`mechsink.interventions.ablation`) replaces the source; the run input is
    still chosen by ``direction``, so ablate the clean run with ``direction="noise"``: ``"zero"``,
    ``"batch_mean"`` (``"mean"``: the mean over the batch of ``reference``, default the source
    input), ``"position_mean"`` (the run input's mean over the positions the unit does not
    patch) or ``"resample"`` (rows of ``reference`` drawn with ``seed``).
    ``batch_size`` patches per forward (default: picked from ``memory_budget`` bytes, see
    :data:`~mechsink.patching.engine.DEFAULT_MEMORY_BUDGET`). ``normalize=True`` rescales
    values so 0 = the run input's metric and 1 = the source input's (denoise: 0 = corrupted,
    1 = clean); it is refused before the sweep when the two differ by float noise only
    (:mod:`mechsink.patching.checks`; ``PatchResult.normalized()`` rescales after the fact). A
    metric saturated at a bound on both inputs (a sink score near 1) warns: the sweep would be
    flat. ``prepend_bos``: whether text inputs get BOS at position 0 (give it for text:
    leaving it out is deprecated; token tensors are used as they are).
    """
    checks.check_inputs("activation_patch", SIGNATURE, clean=clean, corrupted=corrupted,
                        reference=reference)
    checks.check_site_and_metric("activation_patch", SIGNATURE, site, metric)
    if direction not in ("denoise", "noise"):
        raise BadInputError(f"direction must be 'denoise' or 'noise', got {direction!r}.")
    prepend_bos = explicit_bos(prepend_bos, clean, corrupted, reference,
                               where="activation_patch")
    abl = as_ablation(ablation, mean="batch_mean", seed=seed)
    engine.check_batch_size(batch_size)
    parsed = parse_site(site)
    if abl is not None and abl.kind == "position_mean" and parsed.family == "pattern":
        raise BadInputError("position_mean ablation needs a site with a position axis; "
                            "the attention pattern has query and key axes: use zero or "
                            "batch_mean.")
    clean_t = as_tokens(model, clean, prepend_bos=prepend_bos)
    resolved = parsed.resolve(model, clean_t.shape[1])
    # a patch after the last layer the metric reads leaves it unchanged: such units are not
    # run, and nothing after that layer is recorded
    last = engine.last_layer_read(model, engine.prepare_metrics(model, metric,
                                                                 clean_t.shape[1])[1])
    layers = sorted(x for x in set(resolved.axis_values()["layer"]) if x <= last)
    site_names = {resolved.hook_name(layer) for layer in layers}
    resid_names = {act_name("resid_pre", layer) for layer in [0, *layers]}
    run_key, src_key = ("corrupted", "clean") if direction == "denoise" else ("clean", "corrupted")
    keep = {run_key: resid_names | (site_names if abl and abl.kind == "position_mean" else set()),
            src_key: site_names}
    ref_t = None if abl is None or reference is None else as_tokens(
        model, reference, prepend_bos=prepend_bos)
    with torch.no_grad():
        s = engine.setup(model, clean_t, corrupted, metric, prepend_bos=prepend_bos, keep=keep,
                         last_layer=last)
        checks.check_baselines(s.metrics[0], s.clean_values[0], s.corrupted_values[0],
                               normalize=normalize, dtype=getattr(model.cfg, "dtype", None))
        run = s.corrupted if direction == "denoise" else s.clean
        src = s.clean if direction == "denoise" else s.corrupted
        assert run is not None and src is not None
        ref_acts = src.acts if ref_t is None else engine.record(model, ref_t, site_names,
                                                                last).acts
        unpatched = s.corrupted_values[0] if direction == "denoise" else s.clean_values[0]
        assert unpatched is not None
        values = _sweep(model, resolved, s, run, src.acts, ref_acts, abl, batch_size,
                        memory_budget, unpatched)

    clean_value, corr_value = s.clean_values[0], s.corrupted_values[0]
    assert corr_value is not None
    run_value, src_value = (corr_value, clean_value) if direction == "denoise" else (
        clean_value, corr_value)
    if normalize:
        span = src_value - run_value
        if span.abs() < 1e-12:
            raise BadInputError(
                "cannot normalise: the metric has the same value on clean and corrupted runs."
            )
        values = (values - run_value) / span
    return PatchResult.from_site(
        model, resolved, values, metric_name=s.metrics[0].name, clean_value=float(clean_value),
        corrupted_value=float(corr_value), tokens=s.clean.tokens[0], direction=direction,
        ablation=None if abl is None else str(abl), normalized=normalize,
    )


def _chunks(
    model: Any, site: Site, units: list[tuple[int, ...]], s: engine.Setup,
    batch_size: int | None, memory_budget: int | None,
) -> list[tuple[int, list[tuple[int, ...]]]]:
    """Units in batches, latest positions first: ``(first position, units by layer)``.

    Units are grouped by their first patched position; consecutive groups may share batches
    that start at the earliest of their positions (recomputing the later groups' earlier
    tokens, at most :data:`~mechsink.patching.engine.MAX_RECOMPUTE` times their own work).
    Which groups share is chosen by dynamic programming over a cost in layer-tokens: the
    tokens each batch computes plus :data:`~mechsink.patching.engine.BLOCK_CALL_COST` per
    block it runs, so late positions (a token or two each) are batched together rather than
    paying a forward each. Each batch holds at most ``batch_size`` units (or what the memory
    budget and token target allow). With the staircase a batch holds every layer (each unit
    joins at its own); without it, batches hold one layer each.
    """
    reuse = SPEEDUPS["prefix_reuse"] and s.clean.kv is not None  # the model records K/V
    logit_positions = -1 if s.needs.logits == ALL else len(s.needs.logits or ())
    last = engine.last_layer_read(model, s.needs)
    first = {u: site.first_position(u) if reuse else 0 for u in units}
    groups: dict[int, list[tuple[int, ...]]] = {}
    for u in units:
        groups.setdefault(u[0] if not _staircase() else 0, []).append(u)

    def cap(p: int) -> int:
        if batch_size is not None:
            return batch_size
        return engine.copies_per_batch(model, s.batch, s.seq_len, p, logit_positions,
                                       memory_budget=memory_budget)

    out: list[tuple[int, list[tuple[int, ...]]]] = []
    for group in groups.values():
        by_pos: dict[int, list[tuple[int, ...]]] = {}
        for u in group:
            by_pos.setdefault(first[u], []).append(u)
        positions = sorted(by_pos, reverse=True)
        counts = [[0] * (last + 1) for _ in positions]  # units per join layer
        for k, p in enumerate(positions):
            for u in by_pos[p]:
                counts[k][u[0]] += 1
        for k, i in _segments(positions, counts, last, s.seq_len, s.batch, cap):
            ordered = sorted((u for q in positions[i:k] for u in by_pos[q]), key=lambda v: v[0])
            c = cap(positions[k - 1])
            out.extend((positions[k - 1], ordered[j:j + c]) for j in range(0, len(ordered), c))
    return out


def _segments(positions: list[int], counts: list[list[int]], last: int, seq_len: int,
              batch: int, cap: Callable[[int], int]) -> list[tuple[int, int]]:
    """The cheapest split of ``positions`` (latest first) into runs ``positions[i:k]``, each
    computed from its earliest position ``positions[k-1]``: dynamic programming over the
    cost of :func:`_chunks` (``counts[k][layer]``: units of position ``k`` joining there).
    Returned as ``(k, i)`` pairs, latest run first."""
    depth = [last + 1 - layer for layer in range(last + 1)]  # blocks a unit runs
    own = [sum(n * d for n, d in zip(row, depth, strict=True)) * (seq_len - p)
           for row, p in zip(counts, positions, strict=True)]
    best, split = [0.0], [0]
    for k in range(1, len(positions) + 1):
        p = positions[k - 1]
        hist = [0] * (last + 1)
        weight = needed = 0.0
        best.append(float("inf"))
        split.append(k - 1)
        for i in range(k - 1, -1, -1):  # the run positions[i:k]
            hist = [a + b for a, b in zip(hist, counts[i], strict=True)]
            weight += sum(n * d for n, d in zip(counts[i], depth, strict=True))
            needed += own[i]
            if i < k - 1 and weight * (seq_len - p) > engine.MAX_RECOMPUTE * max(needed, 1):
                break
            cost = best[i] + weight * batch * (seq_len - p) + engine.BLOCK_CALL_COST * _blocks(
                hist, depth, cap(p))
            if cost < best[k]:
                best[k], split[k] = cost, i
    runs, k = [], len(positions)
    while k > 0:
        runs.append((k, split[k]))
        k = split[k]
    return runs[::-1]


def _blocks(hist: list[int], depth: list[int], cap: int) -> int:
    """Block calls of the units ``hist`` (per join layer) in batches of ``cap``, layer order:
    each batch runs from its first unit's join layer."""
    total, seen, boundary = 0, 0, 0
    for layer, n in enumerate(hist):
        seen += n
        while boundary < seen:  # a batch starts at unit ``boundary``, which joins here
            total += depth[layer]
            boundary += cap
    return total


def _staircase() -> bool:
    """Whether patches at different layers share a forward (needs start_at_patched_layer)."""
    return SPEEDUPS["staircase"] and SPEEDUPS["start_at_patched_layer"]


def _sweep(
    model: Any, site: Site, s: engine.Setup, run: engine.Run, sources: dict[str, Tensor],
    reference: dict[str, Tensor], abl: Ablation | None, batch_size: int | None,
    memory_budget: int | None, unpatched: Tensor,
) -> Tensor:
    """One value per unit of ``site``, in the site's axis layout; a unit after the last layer
    the metrics read gets ``unpatched`` (the run input's value) without a forward."""
    axis_vals = site.axis_values()
    shape = tuple(len(v) for v in axis_vals.values())
    index_of = [{v: i for i, v in enumerate(vals)} for vals in axis_vals.values()]
    cell = {u: tuple(w[x] for w, x in zip(index_of, u, strict=True)) for u in site.patches()}
    pos_dim = 1 if site.family == "pattern" else 0  # position axis of one unit's mask
    last = engine.last_layer_read(model, s.needs)
    got: dict[tuple[int, ...], Tensor] = {u: unpatched for u in cell if u[0] > last}
    with engine.progress(len(cell), f"patching {site.label}") as bar:
        bar.update(len(got))
        for first, chunk in _chunks(model, site, [u for u in cell if u[0] <= last], s,
                                    batch_size, memory_budget):
            layers = [u[0] for u in chunk]
            start = layers[0] if SPEEDUPS["start_at_patched_layer"] else 0
            joins = layers if _staircase() else None
            hooks = []
            for layer in sorted(set(layers)):
                units = [u for u in chunk if u[0] == layer]
                name = site.hook_name(layer)
                act = sources[name]
                masks = torch.stack([site.mask(u, act.shape[1:]) for u in units]).to(act.device)
                src = _source(act, run.acts.get(name), reference.get(name), abl, masks, site)
                masks = masks.narrow(pos_dim + 1, first, masks.shape[pos_dim + 1] - first)
                src = src.narrow(pos_dim + 2, first, src.shape[pos_dim + 2] - first)
                offset = None if joins is None else layers.index(layer)
                hooks.append((name, _patch_hook(masks, src, s.batch, offset)))
            resid = run.acts[act_name("resid_pre", start)]
            context = f"while patching {site.label} at {chunk[0]}"
            vals = engine.run_patched(model, run, s.metrics, s.needs, resid, start, len(chunk),
                                      hooks, first=first, joins=joins, context=context)[0]
            got.update(zip(chunk, vals, strict=True))
            bar.update(len(chunk))
    return engine.fill(shape, {u: cell[u] for u in cell}, got)


def _source(
    act: Tensor, run_act: Tensor | None, reference: Tensor | None, abl: Ablation | None,
    masks: Tensor, site: Site,
) -> Tensor:
    """What is written where each copy's mask is True: ``[1 or n, batch or 1, ...]``."""
    if abl is None:
        return act.unsqueeze(0)
    if abl.kind == "position_mean":  # per copy: the mean over the positions it leaves alone
        assert run_act is not None
        per_copy = []
        for m in masks:
            ablated = m.reshape(m.shape[0], -1).any(-1)
            per_copy.append(abl.values(run_act, ablated))
        return torch.stack(per_copy)
    ref = reference if reference is not None else act
    return abl.values(act, reference=ref).unsqueeze(0)


def _patch_hook(masks: Tensor, src: Tensor, batch: int, offset: int | None = None) -> HookFn:
    """A hook writing ``src`` where ``masks[i]`` is True into copy ``i`` of a stacked batch;
    with ``offset`` (the staircase), into copy ``offset + i`` of the copies present."""
    n = masks.shape[0]

    def hook(act: Tensor, hook: Any) -> Tensor:
        lo = 0 if offset is None else offset * batch
        part = act[lo:lo + n * batch]
        view = part.reshape(n, batch, *act.shape[1:])
        patched = torch.where(masks.unsqueeze(1), src.to(act.dtype), view).reshape(part.shape)
        if lo == 0 and n * batch == act.shape[0]:
            return write_in_place(act, patched)
        return write_in_place(act, torch.cat([act[:lo], patched, act[lo + n * batch:]]))

    return hook
