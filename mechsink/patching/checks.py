"""Checks every patching call makes before any forward, and on its two baseline values.

- :func:`check_inputs`: clean/corrupted must be text or token ids. A TransformerLens-style call
  (``activation_patch(model, corrupted_tokens, clean_cache, ...)``) passes an
  ``ActivationCache`` where mechsink takes an input; it is named, with the signature.
- :func:`check_baselines`: with ``normalize=True`` the gap between the clean and corrupted
  metric must stand above float noise (relative to the metric's size), and a bounded metric
  (a sink score in [0, 1]) pinned at a bound on both inputs gives a flat sweep: warned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from mechsink.errors import BadInputError, MechsinkWarning, warn

#: within this of a metric's bound on both inputs, a sweep cannot move the metric: warned
SATURATION_MARGIN = 1e-3

#: the smallest relative clean-corrupted gap that ``normalize=True`` accepts in float32/64;
#: half-precision models get ``2 * eps`` of their dtype (see :func:`noise_floor`)
NORMALIZE_RTOL = 1e-5


class SaturatedMetricWarning(MechsinkWarning):
    """The metric sits at one of its bounds on both inputs: the sweep will look flat."""


def _looks_like_cache(x: Any) -> bool:
    return type(x).__name__ == "ActivationCache" or isinstance(x, Mapping)


def _a(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def check_inputs(fn: str, signature: str, **inputs: Any) -> None:
    """Each of ``inputs`` (clean, corrupted, reference) is text, a list of texts or a tensor of
    token ids; anything else is a :class:`BadInputError` naming ``fn``'s ``signature``."""
    for name, x in inputs.items():
        if x is None or isinstance(x, str):
            continue
        what = None
        if _looks_like_cache(x):
            what = (f"{_a(type(x).__name__)} (activations), not an input. mechsink runs both "
                    "inputs itself and caches only what it needs: pass the clean and the "
                    "corrupted prompts (text or token ids), clean first, not "
                    "TransformerLens's (model, corrupted_tokens, clean_cache, ...) order")
        elif isinstance(x, Tensor):
            if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
                what = (f"a {x.dtype} tensor of shape {tuple(x.shape)}; inputs are token ids "
                        "(an integer tensor [batch, pos]) or text, not activations or logits")
        elif isinstance(x, (list, tuple)):
            if not all(isinstance(t, str) for t in x):
                kinds = sorted({type(t).__name__ for t in x if not isinstance(t, str)})
                what = (f"a {type(x).__name__} holding {', '.join(kinds)}; a list of inputs "
                        "must hold strings (token ids go in one integer tensor)")
        else:
            what = _a(type(x).__name__)
        if what is not None:
            raise BadInputError(f"{fn}: {name} is {what}. The signature is {signature}.")


def check_site_and_metric(fn: str, signature: str, site: Any, metric: Any) -> None:
    """``site`` is a site name (a string, a ``("z", 3)`` get_act_name pair or a
    :class:`~mechsink.names.Name`) or a Site; ``metric`` a Metric or callable (or a list)."""
    from mechsink.names import Name
    from mechsink.patching.sites import Site

    get_act_name_form = (isinstance(site, tuple) and len(site) == 2
                         and isinstance(site[0], str) and isinstance(site[1], int))
    if not (isinstance(site, (str, Site, Name)) or get_act_name_form):
        hint = (" (it looks like a metric: the site comes before the metric)"
                if callable(site) else "")
        raise BadInputError(f"{fn}: site must be a site name such as 'resid_pre' or 'z' or a "
                            f"Site, got a {type(site).__name__}{hint}. The signature is "
                            f"{signature}.")
    items = metric if isinstance(metric, (list, tuple)) else [metric]
    for m in items:
        if not (callable(m) or isinstance(m, str)):
            raise BadInputError(f"{fn}: metric must be a mechsink Metric, a metric string "
                                f"('massive_value:11:0:507') or a callable on logits, got a "
                                f"{type(m).__name__}. The signature is {signature}.")


def noise_floor(scale: float, dtype: torch.dtype | None = None) -> float:
    """The smallest gap between two metric values that is not float noise: ``rtol * scale``
    (``rtol`` = :data:`NORMALIZE_RTOL`, or ``2 * eps`` for half-precision dtypes)."""
    rtol = NORMALIZE_RTOL
    if dtype is not None and dtype.is_floating_point:
        rtol = max(rtol, 2 * torch.finfo(dtype).eps)
    return max(1e-12, rtol * scale)


def check_normalizable(clean: float, corrupted: float | None, *, dtype: torch.dtype | None = None,
                       extra_scale: float = 0.0) -> None:
    """Raise unless ``clean`` and ``corrupted`` differ by more than float noise (normalising
    divides by their difference: a noise-sized gap turns every value into a plausible-looking
    +-1 or worse)."""
    if corrupted is None:
        raise BadInputError("cannot normalise: this result has no corrupted run (an ablation); "
                            "read the raw values.")
    span = abs(clean - corrupted)
    scale = max(abs(clean), abs(corrupted), extra_scale)
    floor = noise_floor(scale, dtype)
    if not span > floor:
        raise BadInputError(
            f"cannot normalise: the metric is {clean:.7g} on the clean input and "
            f"{corrupted:.7g} on the corrupted one, a gap of {span:.2g}, within float noise "
            f"({floor:.2g}, relative to the metric's size {scale:.3g}); normalised values "
            "would be noise divided by noise. Read the raw values (normalize=False), or pick "
            "a metric (or a corrupted prompt) that the corruption actually changes."
        )


def check_saturation(metric: Any, clean: float, corrupted: float | None) -> None:
    """Warn when a bounded metric is within :data:`SATURATION_MARGIN` of the same bound on both
    inputs: patching cannot move it, so the sweep is flat whatever the model does."""
    bounds = getattr(metric, "bounds", None)
    if bounds is None or corrupted is None:
        return
    for bound in bounds:
        if bound is None or not math.isfinite(bound):
            continue
        if abs(clean - bound) <= SATURATION_MARGIN and abs(corrupted - bound) <= SATURATION_MARGIN:
            warn(
                f"the metric {getattr(metric, 'name', metric)!r} is {clean:.6g} on the clean "
                f"input and {corrupted:.6g} on the corrupted one, both within "
                f"{SATURATION_MARGIN:g} of its bound {bound:g}: it is saturated, so every patch "
                "will leave it (nearly) unchanged and the sweep will look flat. Pick a metric "
                "that the corruption moves (another head or layer, a logit metric) or a "
                "stronger corruption.",
                SaturatedMetricWarning,
            )
            return


def check_baselines(metric: Any, clean: Tensor | float, corrupted: Tensor | float | None, *,
                    normalize: bool, dtype: torch.dtype | None = None) -> None:
    """Both baseline checks at once, before the sweep: saturation (a warning), then whether
    normalising is meaningful (an error)."""
    c = float(clean)
    x = None if corrupted is None else float(corrupted)
    check_saturation(metric, c, x)
    if normalize:
        check_normalizable(c, x, dtype=dtype)
