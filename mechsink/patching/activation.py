"""Exact, batched activation patching (and zero / batch-mean / position-mean / resample ablation).

Built on :mod:`mechsink.patching.engine`: each patched forward starts at the patched layer,
recomputes only the positions from the earliest patched one (prefix reuse), stacks many patches
per batch and stops after what the metric reads. Results equal
``transformer_lens.patching.get_act_patch_*`` (see tests/test_patching.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.ablation import Ablation, as_ablation
from mechsink.model import act_name, write_in_place
from mechsink.model.memory import check_budget
from mechsink.model.support import check_edits_reach, check_hooks_supported, check_supported
from mechsink.names import Name, explicit_bos
from mechsink.patching import checks, engine, plan
from mechsink.patching.engine import SPEEDUPS, TokensLike, as_tokens
from mechsink.patching.metrics import Metric
from mechsink.patching.result import PatchResult
from mechsink.patching.sites import Site, parse_site

HookFn = Callable[..., Any]
MetricLike = Metric | Callable[[Tensor], Tensor] | str  # str: a metric string (the CLI form)
SIGNATURE = "activation_patch(model, clean, corrupted, site, metric, *, direction=..., ...)"


def activation_patch(
    model: Any,
    clean: TokensLike,
    corrupted: TokensLike,
    site: str | tuple[str, int] | Name | Site,
    metric: MetricLike | Sequence[MetricLike],
    *,
    direction: str = "denoise",
    ablation: str | Ablation | None = None,
    reference: TokensLike | None = None,
    batch_size: int | None = None,
    memory_budget: int | str | None = None,
    normalize: bool = False,
    prepend_bos: bool | None = None,
    seed: int = 0,
) -> PatchResult | list[PatchResult]:
    """Patch every unit of ``site`` and record ``metric``; exact, batched.

    ``direction="denoise"`` runs the corrupted input and patches in clean activations (what
    ``transformer_lens.patching`` does); ``"noise"`` runs clean and patches in corrupted ones.
    ``ablation`` (:mod:`mechsink.interventions.ablation`) replaces the source; the run input is
    still chosen by ``direction``, so ablate the clean run with ``direction="noise"``: ``"zero"``,
    ``"batch_mean"`` (the mean over the batch of ``reference``, default the source input),
    ``"position_mean"`` (the run input's mean over the positions the unit does not patch) or
    ``"resample"`` (rows of ``reference`` drawn with ``seed``).
    ``batch_size`` patches per forward (default: picked from ``memory_budget`` bytes or a size
    such as ``"2GiB"``; default: :func:`mechsink.model.memory.memory_budget`, a share of what
    the device has free). ``normalize=True`` rescales
    values so 0 = the run input's metric and 1 = the source input's (denoise: 0 = corrupted,
    1 = clean); it is refused before the sweep when the two differ by float noise only
    (:mod:`mechsink.patching.checks`; ``PatchResult.normalized()`` rescales after the fact). A
    metric saturated at a bound on both inputs (a sink score near 1) warns: the sweep would be
    flat. Several metrics (a list) share every forward and give a list of results, one per
    metric. ``prepend_bos``: whether text inputs get BOS at position 0 (required for text;
    token tensors are used as they are).
    """
    check_supported(model, "patch")
    checks.check_inputs("activation_patch", SIGNATURE, clean=clean, corrupted=corrupted,
                        reference=reference)
    checks.check_site_and_metric("activation_patch", SIGNATURE, site, metric)
    if direction not in ("denoise", "noise"):
        raise BadInputError(f"direction must be 'denoise' or 'noise', got {direction!r}.")
    prepend_bos = explicit_bos(prepend_bos, clean, corrupted, reference,
                               where="activation_patch")
    abl = as_ablation(ablation, seed=seed)
    engine.check_batch_size(batch_size)
    if memory_budget is not None:
        memory_budget = check_budget(memory_budget)  # before any forward
    parsed = parse_site(site)
    if abl is not None and abl.kind == "position_mean" and parsed.family == "pattern":
        raise BadInputError("position_mean ablation needs a site with a position axis; "
                            "the attention pattern has query and key axes: use zero or "
                            "batch_mean.")
    # a site whose hook never fires (JetMoE's attn.hook_z) or whose edits the model discards
    # (a pattern hooked after the attention ran): one line before any forward
    every_layer = [parsed.hook_name(layer) for layer in range(int(model.cfg.n_layers))]
    named = f"the site {site if isinstance(site, str) else parsed.label!r}"  # as typed
    check_hooks_supported(model, "patch", named, every_layer)
    check_edits_reach(model, "patch", named, every_layer)
    clean_t = as_tokens(model, clean, prepend_bos=prepend_bos)
    resolved = parsed.resolve(model, clean_t.shape[1])
    # a patch after the last layer the metrics read leaves them unchanged: such units are not
    # run, and nothing after that layer is recorded
    corr_t = None if corrupted is None else as_tokens(model, corrupted, prepend_bos=prepend_bos)
    # metric strings parsed and every metric checked against the model once, here; setup
    # binds these to the runs it records
    prepared = engine.prepare_metrics(model, metric, clean_t.shape[1], clean_t, corr_t)
    last = prepared.last_layer
    layers = sorted(x for x in set(resolved.axis_values()["layer"]) if x <= last)
    site_names = {resolved.hook_name(layer) for layer in layers}
    resid_names = {act_name("resid_pre", layer) for layer in [0, *layers]}
    run_key, src_key = ("corrupted", "clean") if direction == "denoise" else ("clean", "corrupted")
    keep = {run_key: resid_names | (site_names if abl and abl.kind == "position_mean" else set()),
            src_key: site_names}
    ref_t = None if abl is None or reference is None else as_tokens(
        model, reference, prepend_bos=prepend_bos)
    with torch.no_grad():
        s = engine.setup(model, clean_t, corr_t, prepared, prepend_bos=prepend_bos, keep=keep,
                         last_layer=last)
        for m, cv, xv in zip(s.metrics, s.clean_values, s.corrupted_values, strict=True):
            checks.check_baselines(m, cv, xv, normalize=normalize,
                                   dtype=getattr(model.cfg, "dtype", None))
        run = s.corrupted if direction == "denoise" else s.clean
        src = s.clean if direction == "denoise" else s.corrupted
        assert run is not None and src is not None
        ref_acts = src.acts if ref_t is None else engine.record(model, ref_t, site_names,
                                                                last).acts
        unpatched = s.corrupted_values if direction == "denoise" else s.clean_values
        grids = _sweep(model, resolved, s, run, src.acts, ref_acts, abl, batch_size,
                       memory_budget, unpatched)  # type: ignore[arg-type]

    results = []
    for m, values, clean_value, corr_value in zip(s.metrics, grids, s.clean_values,
                                                  s.corrupted_values, strict=True):
        assert corr_value is not None
        if normalize:  # the gap stands above float noise: checked before the sweep
            run_value, src_value = (corr_value, clean_value) if direction == "denoise" else (
                clean_value, corr_value)
            values = (values - run_value) / (src_value - run_value)
        results.append(PatchResult.from_site(
            model, resolved, values, metric_name=m.name, clean_value=float(clean_value),
            corrupted_value=float(corr_value), tokens=s.clean.tokens[0], direction=direction,
            ablation=None if abl is None else str(abl), normalized=normalize,
        ))
    return results if isinstance(metric, (list, tuple)) else results[0]


def _sweep(
    model: Any, site: Site, s: engine.Setup, run: engine.Run, sources: dict[str, Tensor],
    reference: dict[str, Tensor], abl: Ablation | None, batch_size: int | None,
    memory_budget: int | None, unpatched: Sequence[Tensor],
) -> list[Tensor]:
    """Per metric, one value per unit of ``site`` in the site's axis layout; a unit after the
    last layer the metrics read gets ``unpatched`` (the run input's values) without a forward."""
    axis_vals = site.axis_values()
    shape = tuple(len(v) for v in axis_vals.values())
    index_of = [{v: i for i, v in enumerate(vals)} for vals in axis_vals.values()]
    cell = {u: tuple(w[x] for w, x in zip(index_of, u, strict=True)) for u in site.patches()}
    pos_dim = 1 if site.family == "pattern" else 0  # position axis of one unit's mask
    last = s.last_layer
    got: list[dict[tuple[int, ...], Tensor]] = [{u: v for u in cell if u[0] > last}
                                                for v in unpatched]
    with engine.progress(len(cell), f"patching {site.label}") as bar:
        bar.update(len(got[0]))
        for first, chunk in plan.chunks(model, site.first_position,
                                        [u for u in cell if u[0] <= last], s, batch_size,
                                        memory_budget):
            layers = [u[0] for u in chunk]
            start = layers[0] if SPEEDUPS["start_at_patched_layer"] else 0
            joins = layers if plan.staircase(model) else None
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
                                      hooks, first=first, joins=joins, context=context)
            for per_metric, v in zip(got, vals, strict=True):
                per_metric.update(zip(chunk, v, strict=True))
            bar.update(len(chunk))
    return [engine.fill(shape, cell, g) for g in got]


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
