"""Attribution patching: the first-order (gradient) estimate of a whole activation-patching
sweep from one forward and one backward pass, and a comparison with the exact sweep.

Estimate for a unit u (denoise): ``m(corrupted) + sum_{u} (a_clean - a_corr) * dm/da``, the
gradient taken on the corrupted run. Massive activations (a few channels 100-10,000x the rest,
and the norm scales they set) make the metric far from linear in places, so always check a
sweep with :func:`compare_to_exact` before trusting it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import scipy.stats
import torch
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model import act_name
from mechsink.model.support import check_supported
from mechsink.names import Name, explicit_bos
from mechsink.patching import checks, engine
from mechsink.patching.engine import TokensLike, as_tokens
from mechsink.patching.metrics import Metric
from mechsink.patching.result import PatchResult
from mechsink.patching.sites import Site, parse_site

MetricLike = Metric | Callable[[Tensor], Tensor] | str  # str: a metric string (the CLI form)


def attribution_patch(
    model: Any,
    clean: TokensLike,
    corrupted: TokensLike,
    site: str | tuple[str, int] | Name | Site,
    metric: MetricLike | Sequence[MetricLike],
    *,
    direction: str = "denoise",
    prepend_bos: bool | None = None,
) -> PatchResult | list[PatchResult]:
    """The linear estimate of ``activation_patch(...)`` over ``site``, same layout and labels.

    One forward of the run input (through :func:`~mechsink.patching.engine.run_patched`) and
    one backward pass per metric; several metrics (a list) give a list of results.
    """
    check_supported(model, "attribution")
    signature = "attribution_patch(model, clean, corrupted, site, metric, *, direction=...)"
    checks.check_inputs("attribution_patch", signature, clean=clean, corrupted=corrupted)
    checks.check_site_and_metric("attribution_patch", signature, site, metric)
    if direction not in ("denoise", "noise"):
        raise BadInputError(f"direction must be 'denoise' or 'noise', got {direction!r}.")
    prepend_bos = explicit_bos(prepend_bos, clean, corrupted, where="attribution_patch")
    clean_t = as_tokens(model, clean, prepend_bos=prepend_bos)
    seq_len = clean_t.shape[1]
    site = parse_site(site).resolve(model, seq_len)
    layers = sorted(set(site.axis_values()["layer"]))
    names = [site.hook_name(layer) for layer in layers]
    run_key, src_key = ("corrupted", "clean") if direction == "denoise" else ("clean", "corrupted")
    with torch.no_grad():
        s = engine.setup(model, clean_t, corrupted, metric, prepend_bos=prepend_bos,
                         keep={src_key: set(names), run_key: {act_name("resid_pre", 0)}})
        for m, cv, xv in zip(s.metrics, s.clean_values, s.corrupted_values, strict=True):
            checks.check_baselines(m, cv, xv, normalize=False)
    run = s.corrupted if direction == "denoise" else s.clean
    src = s.clean if direction == "denoise" else s.corrupted
    assert run is not None and src is not None

    acts: dict[str, Tensor] = {}

    def keep(name: str, act: Tensor) -> Tensor:
        # a new tensor: bridge components use the hooked value only when it is a new object
        acts[name] = act.clone()
        return acts[name]

    hooks = [(n, lambda a, hook, n=n: keep(n, a)) for n in names]
    resid = run.acts[act_name("resid_pre", 0)].detach().clone().requires_grad_(True)
    values = [v[0] for v in engine.run_patched(model, run, s.metrics, s.needs, resid, 0, 1,
                                               hooks, context="on the run input", grad=True)]
    # a layer after the last one the metrics read is never reached (the forward stops there),
    # and a layer a metric does not depend on gets no gradient: its estimate is the baseline
    kept = [n for n in names if n in acts]
    axis_vals = site.axis_values()
    index_of = [{v: i for i, v in enumerate(vals)} for vals in axis_vals.values()]
    results = []
    for i, (m, value) in enumerate(zip(s.metrics, values, strict=True)):
        got = torch.autograd.grad(value, [acts[n] for n in kept],
                                  retain_graph=i < len(values) - 1,
                                  allow_unused=True) if kept else ()
        grads = dict(zip(kept, got, strict=True))
        result = torch.empty(tuple(len(v) for v in axis_vals.values()), dtype=torch.float64)
        base = float(value.detach())
        for layer, name in zip(layers, names, strict=True):
            grad = grads.get(name)
            if grad is None:
                contrib = torch.zeros_like(src.acts[name][0])
            else:  # summed over the batch
                contrib = ((src.acts[name] - acts[name].detach()) * grad).sum(0)
            for u in site.patches():
                if u[0] != layer:
                    continue
                cell = tuple(w[x] for w, x in zip(index_of, u, strict=True))
                result[cell] = base + float(contrib[site.mask(u, contrib.shape)].sum())
        corr_value = s.corrupted_values[i]
        assert corr_value is not None
        results.append(PatchResult.from_site(
            model, site, result, metric_name=m.name, clean_value=float(s.clean_values[i]),
            corrupted_value=float(corr_value), tokens=clean_t[0], direction=direction,
            method="attribution",
        ))
    return results if isinstance(metric, (list, tuple)) else results[0]


def compare_to_exact(approx: PatchResult, exact: PatchResult, *, top: int = 5) -> dict[str, Any]:
    """Pearson and Spearman rank correlation of the effects (scipy's), and the ``top`` worst
    disagreements.

    Effects are values minus the run input's metric, so a constant offset does not count.
    """
    if approx.values.shape != exact.values.shape or approx.axes != exact.axes:
        raise BadInputError(
            f"results differ in layout: {approx.axes} {tuple(approx.values.shape)} vs "
            f"{exact.axes} {tuple(exact.values.shape)}; compare sweeps of the same site."
        )
    run = exact.meta.get("direction", "denoise") == "denoise"
    base = exact.corrupted_value if run else exact.clean_value
    a = (approx.values - base).flatten().double()
    e = (exact.values - base).flatten().double()
    err = (a - e).abs()
    shape = exact.values.shape
    worst = []
    for i in err.argsort(descending=True)[:top].tolist():
        idx = [int(j) for j in torch.unravel_index(torch.tensor(i), shape)]
        row = {k: exact.labels[k][j] for k, j in zip(exact.axes, idx, strict=True)}
        worst.append({**row, "approx": float(a[i]), "exact": float(e[i]), "error": float(err[i])})
    return {
        "pearson": correlation(a, e, "pearson"), "spearman": correlation(a, e, "spearman"),
        "max_abs_error": float(err.max()), "worst": worst,
    }


def correlation(a: Tensor, b: Tensor, kind: str = "spearman") -> float:
    """scipy's Pearson or Spearman correlation of two 1-D tensors; NaN when there are fewer
    than two values or one side is constant (nothing to correlate)."""
    x, y = a.double().cpu().numpy(), b.double().cpu().numpy()
    if x.size < 2 or x.min() == x.max() or y.min() == y.max():
        return float("nan")
    fn = scipy.stats.spearmanr if kind == "spearman" else scipy.stats.pearsonr
    return float(fn(x, y)[0])
