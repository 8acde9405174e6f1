"""Exact, batched activation patching (and zero / mean / resample ablation).

Why it is fast: a patched run equals its source run upstream of the patch, so each patched
forward starts at the patched layer from the cached residual (blocks before it are not run);
many patches are stacked in the batch of one forward; and the forward stops after the last
hook the metric reads (no unembedding for an activation metric, and only the positions a
logit metric reads for :class:`~mechsink.patching.metrics.LogitDiff` and friends).
Results equal ``transformer_lens.patching.get_act_patch_*`` (see tests/test_patching.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.bridge import (
    check_seq_len,
    hook_names,
    run_from_layer,
    to_tokens,
    unembed,
    write_in_place,
)
from mechsink.errors import BadInputError
from mechsink.patching.metrics import (
    ALL,
    Metric,
    Needs,
    Outputs,
    as_metric,
    check_value,
    layer_of,
)
from mechsink.patching.result import PatchResult
from mechsink.patching.sites import Site, parse_site

TokensLike = str | Sequence[str] | Tensor
HookFn = Callable[..., Any]

#: tokens per patched forward when batch_size is None (tuned on a 2-core CPU, see benchmarks)
DEFAULT_TOKENS_PER_BATCH = 512

#: the speed ideas, switchable so benchmarks/patching.py can measure what each one buys
#: (results are identical either way): start at the patched layer, stop after the metric.
SPEEDUPS = {"start_at_patched_layer": True, "early_stop": True}


def as_tokens(model: Any, x: TokensLike, *, prepend_bos: bool = True) -> Int[Tensor, "batch pos"]:
    """Token ids from text (BOS prepended when ``prepend_bos``) or a token tensor."""
    if isinstance(x, Tensor):
        if x.is_floating_point() or x.ndim not in (1, 2):
            raise BadInputError(
                f"tokens must be an integer tensor [batch, pos] (got {x.dtype}, {x.ndim}-d)."
            )
        t = x if x.ndim == 2 else x.unsqueeze(0)
        check_seq_len(model, t.shape[1])
        return t.to(getattr(model.cfg, "device", None) or "cpu")
    return to_tokens(model, x, prepend_bos=prepend_bos)


def check_pair(clean: Tensor, corrupted: Tensor) -> None:
    """Clean and corrupted must have the same shape (same batch, same number of tokens)."""
    if clean.shape != corrupted.shape:
        raise BadInputError(
            f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} token shapes "
            "differ: patching needs prompts of the same length (pad or pick prompts that "
            "tokenise to the same number of tokens)."
        )


def resolve_needs(model: Any, metric: Metric, seq_len: int) -> Needs:
    """The metric's needs with logit positions made non-negative and hook names checked."""
    needs = metric.needs(model)
    known = hook_names(model)
    unknown = sorted(h for h in needs.hooks if h not in known)
    if unknown:
        raise BadInputError(f"the metric reads hooks this model does not have: {unknown}.")
    if isinstance(needs.logits, tuple):
        pos = []
        for p in needs.logits:
            q = p + seq_len if p < 0 else p
            if not 0 <= q < seq_len:
                raise BadInputError(f"the metric reads position {p}, outside 0..{seq_len - 1}.")
            pos.append(q)
        needs = Needs(needs.hooks, tuple(sorted(set(pos))))
    return needs


def run_stacked(
    model: Any,
    resid: Float[Tensor, "batch pos d_model"],
    start: int,
    n: int,
    patch_hooks: Sequence[tuple[str, HookFn]],
    metric: Metric,
    needs: Needs,
    *,
    upstream: dict[str, Tensor] | None = None,
    stacked: bool = False,
    where: str = "",
) -> list[Tensor]:
    """Run ``n`` stacked copies of ``resid`` from block ``start`` and return one metric value each.

    ``patch_hooks`` see activations of batch ``n * batch`` (copy-major). The forward stops as
    soon as the metric has what it reads. Hooks the metric reads upstream of ``start`` are not
    run: their (unpatched) values come from ``upstream``, the run input's cache.
    """
    b0, seq_len = resid.shape[0] // (n if stacked else 1), resid.shape[1]
    n_layers = int(model.cfg.n_layers)
    captured: dict[str, Tensor] = {}

    def capture_as(name: str) -> HookFn:  # keyed by the name asked for (hooks have aliases)
        def capture(act: Tensor, hook: Any) -> None:
            captured[name] = act

        return capture

    final = f"blocks.{n_layers - 1}.hook_resid_post"
    before = {h for h in needs.hooks if (layer_of(h) if layer_of(h) is not None else -1) < start}
    for h in before:
        if upstream is None or h not in upstream:
            raise RuntimeError(f"{h} is upstream of layer {start}: pass its cached value")
        captured[h] = upstream[h].repeat(n, *[1] * (upstream[h].ndim - 1))
    wanted = set(needs.hooks) - before
    few_logits = isinstance(needs.logits, tuple)
    if few_logits:
        wanted.add(final)
    hooks = list(patch_hooks) + [(h, capture_as(h)) for h in sorted(wanted)]
    rows = resid if stacked or n == 1 else resid.repeat(n, 1, 1)
    if needs.logits == ALL or wanted:
        early = needs.logits != ALL and SPEEDUPS["early_stop"]
        logits = run_from_layer(
            model, rows, start, fwd_hooks=hooks, stop_after=tuple(sorted(wanted)) if early else (),
        )
    else:
        logits = None  # everything the metric reads is upstream of the patch
    positions: tuple[int, ...] | None = None
    if few_logits:
        positions = needs.logits  # type: ignore[assignment]
        logits = unembed(model, captured[final][:, list(positions)])
    values = []
    for i in range(n):
        rows = slice(i * b0, (i + 1) * b0)
        out = Outputs(
            seq_len,
            {h: a[rows] for h, a in captured.items() if h in needs.hooks},
            None if logits is None or needs.logits is None else logits[rows],
            positions,
        )
        values.append(check_value(metric(out), f"{where} (patch {i})" if where else ""))
    return values


def outputs_on(model: Any, tokens: Int[Tensor, "batch pos"], needs: Needs) -> Outputs:
    """What a metric with ``needs`` sees on an unpatched run of ``tokens``."""
    names = set(needs.hooks) | {"blocks.0.hook_resid_pre"}
    n_layers = int(model.cfg.n_layers)
    final = f"blocks.{n_layers - 1}.hook_resid_post"
    if isinstance(needs.logits, tuple):
        names.add(final)
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    positions = None
    if isinstance(needs.logits, tuple):
        positions = needs.logits
        logits = unembed(model, cache[final][:, list(positions)])
    return Outputs(
        tokens.shape[1], {h: cache[h] for h in needs.hooks},
        None if needs.logits is None else logits, positions,
    )


def default_batch_size(batch: int, seq_len: int) -> int:
    """Patches per forward: about DEFAULT_TOKENS_PER_BATCH tokens, at least one patch."""
    return max(1, DEFAULT_TOKENS_PER_BATCH // max(1, batch * seq_len))


def activation_patch(
    model: Any,
    clean: TokensLike,
    corrupted: TokensLike,
    site: str | Site,
    metric: Metric | Callable[[Tensor], Tensor],
    *,
    direction: str = "denoise",
    ablation: str | None = None,
    reference: TokensLike | None = None,
    batch_size: int | None = None,
    normalize: bool = False,
    prepend_bos: bool = True,
    seed: int = 0,
) -> PatchResult:
    """Patch every unit of ``site`` and record ``metric``; exact, batched.

    ``direction="denoise"`` runs the corrupted input and patches in clean activations (what
    ``transformer_lens.patching`` does); ``"noise"`` runs clean and patches in corrupted ones.
    ``ablation`` replaces the source (the run input is still chosen by ``direction``, so ablate
    the clean run with ``direction="noise"``): ``"zero"``, ``"mean"`` (mean over the batch of
    ``reference``, default the source input) or ``"resample"`` (a row of ``reference`` picked
    with ``seed``). ``normalize=True`` rescales values so 0 = the run input's metric and 1 = the
    source input's (denoise: 0 = corrupted, 1 = clean).
    """
    if direction not in ("denoise", "noise"):
        raise BadInputError(f"direction must be 'denoise' or 'noise', got {direction!r}.")
    if ablation not in (None, "zero", "mean", "resample"):
        raise BadInputError(f"ablation must be zero, mean or resample, got {ablation!r}.")
    if batch_size is not None and batch_size < 1:
        raise BadInputError(f"batch_size must be at least 1, got {batch_size}.")
    clean_t = as_tokens(model, clean, prepend_bos=prepend_bos)
    corr_t = as_tokens(model, corrupted, prepend_bos=prepend_bos)
    check_pair(clean_t, corr_t)
    b0, seq_len = clean_t.shape
    site = parse_site(site).resolve(model, seq_len)
    metric = as_metric(metric)
    needs = resolve_needs(model, metric, seq_len)
    run_t, src_t = (corr_t, clean_t) if direction == "denoise" else (clean_t, corr_t)
    layers = sorted(set(site.axis_values()["layer"]))

    with torch.no_grad():
        clean_out = outputs_on(model, clean_t, needs)
        metric = metric.bind(clean_out)
        clean_value = check_value(metric(clean_out), "on the clean run")
        corr_value = check_value(metric(outputs_on(model, corr_t, needs)), "on the corrupted run")
        resid_names = {f"blocks.{layer}.hook_resid_pre" for layer in [0, *layers]}
        resid_names |= set(needs.hooks)
        site_names = {site.hook_name(layer) for layer in layers}
        _, run_cache = model.run_with_cache(run_t, names_filter=lambda n: n in resid_names)
        sources = _sources(model, site_names, src_t, ablation, reference, prepend_bos, seed)
        values = _sweep(model, site, run_cache, sources, metric, needs, b0, seq_len, batch_size)

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
        model, site, values, metric_name=metric.name, clean_value=float(clean_value),
        corrupted_value=float(corr_value), tokens=clean_t[0], direction=direction,
        ablation=ablation, normalized=normalize,
    )


def _sources(
    model: Any,
    names: set[str],
    src_t: Tensor,
    ablation: str | None,
    reference: TokensLike | None,
    prepend_bos: bool,
    seed: int,
) -> dict[str, Tensor]:
    """The activations patched in, per hook name: from the source run or an ablation."""
    if ablation is None or reference is None:
        ref_t = src_t
    else:
        ref_t = as_tokens(model, reference, prepend_bos=prepend_bos)
    _, cache = model.run_with_cache(ref_t, names_filter=lambda n: n in names)
    out = {}
    for name in names:
        act = cache[name]
        if ablation == "zero":
            act = torch.zeros_like(act[:1])
        elif ablation == "mean":
            act = act.mean(0, keepdim=True)
        elif ablation == "resample":
            g = torch.Generator().manual_seed(seed)
            act = act[int(torch.randint(act.shape[0], (1,), generator=g))].unsqueeze(0)
        if ablation is not None and act.shape[1] != src_t.shape[1]:
            raise BadInputError(
                f"reference has {act.shape[1]} tokens but the prompts have {src_t.shape[1]}."
            )
        out[name] = act
    return out


def _sweep(
    model: Any,
    site: Site,
    run_cache: Any,
    sources: dict[str, Tensor],
    metric: Metric,
    needs: Needs,
    b0: int,
    seq_len: int,
    batch_size: int | None,
) -> Tensor:
    """One value per unit of ``site``, in the site's axis layout."""
    units = site.units()
    axis_vals = site.axis_values()
    shape = tuple(len(v) for v in axis_vals.values())
    where = [{v: i for i, v in enumerate(vals)} for vals in axis_vals.values()]
    result = torch.empty(shape, dtype=torch.float64)
    per_batch = batch_size or default_batch_size(b0, seq_len)
    upstream = {h: run_cache[h] for h in needs.hooks}
    by_layer: dict[int, list[tuple[int, ...]]] = {}
    for u in units:
        by_layer.setdefault(u[0], []).append(u)
    for layer, layer_units in by_layer.items():
        name = site.hook_name(layer)
        src = sources[name]
        start = layer if SPEEDUPS["start_at_patched_layer"] else 0
        resid = run_cache[f"blocks.{start}.hook_resid_pre"]
        for lo in range(0, len(layer_units), per_batch):
            chunk = layer_units[lo:lo + per_batch]
            masks = torch.stack([site.mask(u, src.shape[1:]) for u in chunk]).to(src.device)
            hook = _patch_hook(masks, src, b0)
            vals = run_stacked(model, resid, start, len(chunk), [(name, hook)], metric, needs,
                               upstream=upstream,
                               where=f"while patching {site.label} at {chunk[0]}")
            for u, v in zip(chunk, vals, strict=True):
                result[tuple(w[x] for w, x in zip(where, u, strict=True))] = v
    return result


def _patch_hook(masks: Tensor, src: Tensor, b0: int) -> HookFn:
    """A hook writing ``src`` where ``masks[i]`` is True into copy ``i`` of a stacked batch."""
    n = masks.shape[0]

    def hook(act: Tensor, hook: Any) -> Tensor:
        view = act.reshape(n, b0, *act.shape[1:])
        patched = torch.where(masks.unsqueeze(1), src.unsqueeze(0).to(act.dtype), view)
        return write_in_place(act, patched.reshape(act.shape))

    return hook
