"""Simulated activation quantization: what the massive activations cost a low-bit format (Sun et
al. 2024, "Massive Activations in Large Language Models"; Yu et al. 2024, "The Super Weight in
Large Language Models").

Per layer and sequence, the residual stream (``hook_resid_post``, ``[pos, d_model]``) and the
down-projection input (``mlp.hook_post``, ``[pos, d_mlp]``) are quantized with symmetric
round-to-nearest, ``q = clamp(round(x / scale), -qmax, qmax)``, ``qmax = 2^(bits-1) - 1``
(127 for int8, 7 for int4), ``scale = max |x| / qmax`` taken

- *per tensor*: over the whole ``[pos, channel]`` matrix of the sequence, or
- *per channel*: over positions, one scale per channel;

and the error reported is the relative error ``||x - q scale|| / ||x||`` (Frobenius) of the
*ordinary* channels (every channel but the outlier channels below), mean over sequences: the
outliers' own entries would dominate both norms and hide that the ordinary values round to 0.
The same channels are measured in both settings. *Outliers kept*: the outlier channels of that
sequence and layer stay in full precision and do not set the scale of the rest (as LLM.int8
keeps its outlier features, detected per forward: Dettmers et al. 2022, "LLM.int8(): 8-bit Matrix
Multiplication for Transformers at Scale"). Outlier channels of the residual stream are
those holding a massive activation (Sun et al.'s rule against the layer's median: ``|x| > 100``
and ``>= 1000 x`` the median ``|x|`` of the layer); of the down-projection input, the neurons
above Yu et al.'s super-neuron spike threshold (``|x| > 50``) at some position.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mechsink.measure.cache import CacheLike, hook_name, n_layers_in, rounded, rounded_list
from mechsink.measure.massive import ABS_THRESHOLD, RATIO_THRESHOLD, abs_median
from mechsink.measure.super_neurons import SPIKE_THRESHOLD

HOOKS = ("hook_resid_post", "mlp.hook_post")
SITES = {"hook_resid_post": "residual", "mlp.hook_post": "down_proj_input"}
BITS = (8, 4)
GRANULARITIES = ("per_tensor", "per_channel")


def fake_quantize(
    x: Float[Tensor, "batch pos channel"], bits: int, granularity: str,
    keep: Bool[Tensor, "batch channel"] | None = None,
) -> Float[Tensor, "batch pos channel"]:
    """``x`` quantized and dequantized per sequence (symmetric round-to-nearest, see the module
    doc); channels in ``keep`` are left as they are and set no scale."""
    qmax = 2 ** (bits - 1) - 1
    mask = None if keep is None else keep[:, None, :].expand_as(x)
    mag = x.abs() if mask is None else x.abs().masked_fill(mask, 0.0)
    if granularity == "per_tensor":
        peak = mag.amax(dim=(1, 2), keepdim=True)
    elif granularity == "per_channel":
        peak = mag.amax(dim=1, keepdim=True)
    else:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    scale = torch.where(peak > 0, peak / qmax, torch.ones_like(peak))
    q = torch.clamp(torch.round(x / scale), -qmax, qmax) * scale
    return q if mask is None else torch.where(mask, x, q)


def relative_error(x: Float[Tensor, "batch pos channel"], q: Float[Tensor, "batch pos channel"],
                   outliers: Bool[Tensor, "batch channel"] | None = None,
                   ) -> Float[Tensor, " batch"]:
    """``||x - q|| / ||x||`` per sequence over the channels not in ``outliers`` (0 where those
    are all zeros)."""
    if outliers is not None:
        ordinary = ~outliers[:, None, :]
        x, q = x * ordinary, q * ordinary
    norm = x.flatten(1).norm(dim=1)
    err = (x - q).flatten(1).norm(dim=1)
    return torch.where(norm > 0, err / norm.clamp_min(torch.finfo(norm.dtype).tiny),
                       torch.zeros_like(norm))


def outlier_channels(x: Float[Tensor, "batch pos channel"], site: str
                     ) -> Bool[Tensor, "batch channel"]:
    """The channels kept in full precision (module doc): massive residual channels, or
    down-projection inputs above the spike threshold."""
    if site == "mlp.hook_post":
        return (x.abs() > SPIKE_THRESHOLD).any(1)
    median = abs_median(x.flatten(1))[:, None, None]
    massive = (x.abs() > ABS_THRESHOLD) & (x.abs() >= RATIO_THRESHOLD * median)
    return massive.any(1)


@dataclass(frozen=True)
class QuantizationErrors:
    """Relative quantization error per (site, bits, granularity, outliers kept or not), each
    ``[batch, layer]``, and the number of channels kept per sequence and layer."""

    errors: dict[tuple[str, int, str, bool], Float[Tensor, "batch layer"]]
    kept: dict[str, Float[Tensor, "batch layer"]]

    @classmethod
    def merge(cls, parts: Sequence[QuantizationErrors]) -> QuantizationErrors:
        first = parts[0]
        return cls({k: torch.cat([p.errors[k] for p in parts]) for k in first.errors},
                   {k: torch.cat([p.kept[k] for p in parts]) for k in first.kept})

    def error(self, site: str, bits: int, granularity: str, kept: bool = False
              ) -> Float[Tensor, " layer"]:
        """The mean error over sequences per layer of one setting (``site`` a hook suffix)."""
        return self.errors[(site, bits, granularity, kept)].double().mean(0)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for (site, bits, gran, kept), err in self.errors.items():
            row = out.setdefault(SITES[site], {}).setdefault(f"int{bits}", {}).setdefault(gran, {})
            row["outliers_kept" if kept else "all"] = rounded_list(err.double().mean(0), 4)
        for site, count in self.kept.items():
            out[SITES[site]]["kept_channels"] = rounded_list(count.double().mean(0), 4)
            out[SITES[site]]["hook"] = site
        worst = {f"{SITES[s]}_int{b}_{g}": rounded(self.error(s, b, g).max(), 4)
                 for s, b, g, k in self.errors if not k}
        return {"quantization": {
            "method": "symmetric round-to-nearest, scale = max|x| / (2^(bits-1) - 1) per "
                      "sequence (per tensor, or per channel over positions); relative error "
                      "||x - Q(x)|| / ||x|| of the ordinary (non-outlier) channels; outliers kept: "
                      "massive residual channels (Sun et al.) or down-projection inputs > 50 "
                      "(Yu et al.) left in full precision",
            "largest_error": worst, **out}}


def quantization_errors(cache: CacheLike, sites: Sequence[str] | None = None
                        ) -> QuantizationErrors:
    """Every setting of the module doc for each hook in ``sites`` (default: those of
    :data:`HOOKS` the cache holds), one layer at a time."""
    if sites is None:
        held = {k.split(".", 2)[-1] for k in cache.keys() if k.startswith("blocks.0.")}
        sites = [s for s in HOOKS if s in held] or list(HOOKS)
    errors: dict[tuple[str, int, str, bool], Tensor] = {}
    kept: dict[str, Tensor] = {}
    for site in sites:
        per_layer: dict[tuple[str, int, str, bool], list[Tensor]] = {}
        counts = []
        for layer in range(n_layers_in(cache, site)):  # one layer at a time: a hybrid
            x = cache[hook_name(layer, site)].float()  # model's MLPs differ in width
            keep = outlier_channels(x, site)
            counts.append(keep.sum(-1).float())
            for bits in BITS:
                for gran in GRANULARITIES:
                    for keep_out in (False, True):
                        q = fake_quantize(x, bits, gran, keep if keep_out else None)
                        per_layer.setdefault((site, bits, gran, keep_out), []).append(
                            relative_error(x, q, keep))
        for key, values in per_layer.items():
            errors[key] = torch.stack(values, 1).cpu()
        kept[site] = torch.stack(counts, 1).cpu()
    return QuantizationErrors(errors, kept)
