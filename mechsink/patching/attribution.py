"""Attribution patching: the first-order (gradient) estimate of a whole activation-patching
sweep from one forward and one backward pass, and a comparison with the exact sweep.

Estimate for a unit u (denoise): ``m(corrupted) + sum_{u} (a_clean - a_corr) * dm/da``, the
gradient taken on the corrupted run. Massive activations (a few channels 100-10,000x the rest,
and the norm scales they set) make the metric far from linear in places, so always check a
sweep with :func:`compare_to_exact` before trusting it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model import act_name, run_from_layer, unembed
from mechsink.names import Name, explicit_bos
from mechsink.patching import checks, engine
from mechsink.patching.engine import TokensLike, as_tokens
from mechsink.patching.metrics import Metric, Outputs, check_value
from mechsink.patching.result import PatchResult
from mechsink.patching.sites import Site, parse_site


def attribution_patch(
    model: Any,
    clean: TokensLike,
    corrupted: TokensLike,
    site: str | tuple[str, int] | Name | Site,
    metric: Metric | Callable[[Tensor], Tensor],
    *,
    direction: str = "denoise",
    prepend_bos: bool | None = None,
) -> PatchResult:
    """The linear estimate of ``activation_patch(...)`` over ``site``, same layout and labels."""
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
        checks.check_baselines(s.metrics[0], s.clean_values[0], s.corrupted_values[0],
                               normalize=False)
    run = s.corrupted if direction == "denoise" else s.clean
    src = s.clean if direction == "denoise" else s.corrupted
    assert run is not None and src is not None
    metric_, needs = s.metrics[0], s.needs

    acts: dict[str, Tensor] = {}
    grads: dict[str, Tensor] = {}
    captured: dict[str, Tensor] = {}
    final = engine.final_resid(model)

    def keep(name: str, act: Tensor) -> Tensor:
        # a new tensor: bridge components use the hooked value only when it is a new object
        out = act.clone()
        acts[name] = out.detach()
        out.register_hook(lambda g: grads.__setitem__(name, g.detach()))
        return out

    hooks: list[tuple[str, Any]] = [
        (n, lambda a, hook, n=n: keep(n, a)) for n in names
    ]
    wanted = set(needs.hooks) | ({final} if isinstance(needs.logits, tuple) else set())
    hooks += [(h, lambda a, hook, h=h: captured.__setitem__(h, a)) for h in sorted(wanted)]
    resid = run.acts[act_name("resid_pre", 0)].detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = run_from_layer(model, resid, 0, fwd_hooks=hooks)
        positions = None
        if isinstance(needs.logits, tuple):
            positions = needs.logits
            logits = unembed(model, captured[final][:, list(positions)])
        out = Outputs(seq_len, {h: captured[h] for h in needs.hooks},
                      None if needs.logits is None else logits, positions)
        value = metric_(out)
        check_value(value.detach() if isinstance(value, Tensor) else value, "on the run input",
                    metric_)
        value.backward()

    axis_vals = site.axis_values()
    index_of = [{v: i for i, v in enumerate(vals)} for vals in axis_vals.values()]
    result = torch.empty(tuple(len(v) for v in axis_vals.values()), dtype=torch.float64)
    base = float(value.detach())
    for layer, name in zip(layers, names, strict=True):
        if name not in grads:  # the metric does not depend on this layer's activation
            grads[name] = torch.zeros_like(acts[name])
        contrib = ((src.acts[name] - acts[name]) * grads[name]).sum(0)  # sum over batch
        for u in site.patches():
            if u[0] != layer:
                continue
            m = site.mask(u, contrib.shape)
            cell = tuple(w[x] for w, x in zip(index_of, u, strict=True))
            result[cell] = base + float(contrib[m].sum())
    clean_value, corr_value = s.clean_values[0], s.corrupted_values[0]
    assert corr_value is not None
    return PatchResult.from_site(
        model, site, result, metric_name=metric_.name, clean_value=float(clean_value),
        corrupted_value=float(corr_value), tokens=clean_t[0], direction=direction,
        method="attribution",
    )


def compare_to_exact(approx: PatchResult, exact: PatchResult, *, top: int = 5) -> dict[str, Any]:
    """Pearson and rank correlation of the effects, and the ``top`` worst disagreements.

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

    def corr(x: Tensor, y: Tensor) -> float:
        x, y = x - x.mean(), y - y.mean()
        den = float(x.norm() * y.norm())
        return float((x * y).sum()) / den if den > 0 else float("nan")

    def ranks(x: Tensor) -> Tensor:
        return x.argsort().argsort().double()

    err = (a - e).abs()
    shape = exact.values.shape
    worst = []
    for i in err.argsort(descending=True)[:top].tolist():
        idx = [int(j) for j in torch.unravel_index(torch.tensor(i), shape)]
        row = {k: exact.labels[k][j] for k, j in zip(exact.axes, idx, strict=True)}
        worst.append({**row, "approx": float(a[i]), "exact": float(e[i]), "error": float(err[i])})
    return {
        "pearson": corr(a, e), "spearman": corr(ranks(a), ranks(e)),
        "max_abs_error": float(err.max()), "worst": worst,
    }
