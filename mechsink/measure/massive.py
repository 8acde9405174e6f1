"""Massive activations (Sun et al. 2024, "Massive Activations in Large Language Models").

A residual entry ``x[l, p, c]`` (``hook_resid_post`` of block ``l``) is massive when
``|x| > 100`` and ``|x| >= 1000 x`` a reference median magnitude. Two references are reported:

- ``position`` (a per-token reference): the median over channels of ``|x[l, p, :]|``;
- ``layer`` (what Sun et al.'s released code compares with): the median of ``|x[l]|`` over all
  positions and channels of the sequence. A massive token's own median is inflated by the
  token's large norm, so this reference finds more.

Per layer we also report, as Sun et al. plot it, the top-3 magnitudes and the median magnitude
over all positions and channels of a sequence, averaged over sequences. Medians of an even
count are the mean of the two middle values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.cache import CacheLike, frame, rounded, rounded_list, stacked

HOOKS = ("hook_resid_post",)
ABS_THRESHOLD = 100.0
RATIO_THRESHOLD = 1000.0
REFERENCES = ("position", "layer")


def abs_median(x: Float[Tensor, "... d"]) -> Float[Tensor, "..."]:
    """Median of ``|x|`` over the last axis (mean of the two middle values when d is even)."""
    a = x.abs()
    d = a.shape[-1]
    low = a.kthvalue((d + 1) // 2, dim=-1).values
    high = low if d % 2 else a.kthvalue(d // 2 + 1, dim=-1).values
    return (low + high) / 2


def find_massive(
    resid: Float[Tensor, "layer batch pos d_model"],
    reference: str = "position",
    abs_threshold: float = ABS_THRESHOLD,
    ratio_threshold: float = RATIO_THRESHOLD,
) -> tuple[Int[Tensor, "hit 4"], Float[Tensor, " hit"], Float[Tensor, " hit"]]:
    """Every massive entry as (layer, sequence, position, channel), its signed value and its
    ratio to the reference median (``"position"`` or ``"layer"``, see module doc)."""
    if reference == "position":
        median = abs_median(resid)[..., None]
    elif reference == "layer":
        median = abs_median(resid.flatten(2))[..., None, None]
    else:
        raise BadInputError(f"reference must be one of {REFERENCES}, got {reference!r}.")
    median = median.expand_as(resid)
    mask = (resid.abs() > abs_threshold) & (resid.abs() >= ratio_threshold * median)
    idx = torch.nonzero(mask)
    values = resid[mask]
    return idx, values, values.abs() / median[mask]


def layer_magnitudes(
    resid: Float[Tensor, "layer batch pos d_model"],
) -> tuple[Float[Tensor, "batch layer 3"], Float[Tensor, "batch layer"]]:
    """Per sequence and layer, the three largest ``|x|`` and the median ``|x|`` over
    (position, channel)."""
    flat = resid.abs().flatten(2)
    top3 = flat.topk(min(3, flat.shape[-1]), dim=-1).values
    return top3.transpose(0, 1), abs_median(flat).transpose(0, 1)


@dataclass(frozen=True)
class MassiveActivation:
    """One (layer, position, channel) that was massive in ``count`` sequences: mean signed
    value, mean ratio to the reference median and largest magnitude over those sequences."""

    layer: int
    position: int
    channel: int
    value: float
    ratio_to_median: float
    max_abs: float
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "position": self.position, "channel": self.channel,
                "value": rounded(self.value), "ratio_to_median": rounded(self.ratio_to_median),
                "max_abs": rounded(self.max_abs), "count": self.count}


@dataclass(frozen=True)
class MassiveHits:
    """Massive entries of a batch: (layer, sequence, position, channel), value, ratio."""

    n_sequences: int
    index: Int[Tensor, "hit 4"]
    values: Float[Tensor, " hit"]
    ratios: Float[Tensor, " hit"]

    @classmethod
    def merge(cls, parts: Sequence[MassiveHits]) -> MassiveHits:
        """Concatenate chunks of sequences (sequence indices are offset to stay unique)."""
        index, offset = [], 0
        for p in parts:
            shifted = p.index.clone()
            shifted[:, 1] += offset
            index.append(shifted)
            offset += p.n_sequences
        return cls(offset, torch.cat(index), torch.cat([p.values for p in parts]),
                   torch.cat([p.ratios for p in parts]))

    def grouped(self) -> list[MassiveActivation]:
        """Entries grouped by (layer, position, channel), in that order."""
        groups: dict[tuple[int, int, int], list[int]] = {}
        for i, (layer, _, pos, ch) in enumerate(self.index.tolist()):
            groups.setdefault((layer, pos, ch), []).append(i)
        out = []
        for (layer, pos, ch), rows in sorted(groups.items()):
            v = self.values[rows].double()
            out.append(MassiveActivation(layer, pos, ch, float(v.mean()),
                                         float(self.ratios[rows].double().mean()),
                                         float(v.abs().max()), len(rows)))
        return out


@dataclass(frozen=True)
class MassiveReport:
    """Massive entries under both references, and per-layer magnitudes per sequence."""

    by_position: MassiveHits
    by_layer: MassiveHits
    top3: Float[Tensor, "batch layer 3"]
    median: Float[Tensor, "batch layer"]

    @classmethod
    def merge(cls, parts: Sequence[MassiveReport]) -> MassiveReport:
        return cls(MassiveHits.merge([p.by_position for p in parts]),
                   MassiveHits.merge([p.by_layer for p in parts]),
                   torch.cat([p.top3 for p in parts]), torch.cat([p.median for p in parts]))

    def __repr__(self) -> str:
        batch, layers = int(self.median.shape[0]), int(self.median.shape[1])
        return (f"MassiveReport({batch} sequences x {layers} layers, massive activations: "
                f"{len(self.activations('position'))} (token median), "
                f"{len(self.activations('layer'))} (layer median), top |x| "
                f"{float(self.top3.double().amax()) if self.top3.numel() else 0.0:.4g})")

    def _repr_html_(self) -> str:
        """A card for Jupyter: both rules' massive activations (the first ten of each)."""
        from html import escape

        parts = [f"<div><b>{escape(repr(self))}</b>"]
        for ref, label in (("position", "token median"), ("layer", "layer median")):
            table = self.to_frame(ref).head(10).to_html(index=False, float_format="%.4g")
            parts.append(f"<p>{label} rule</p>{table}")
        return "".join(parts) + "</div>"

    def activations(self, reference: str = "position") -> list[MassiveActivation]:
        """Grouped massive entries under ``reference`` (``"position"`` or ``"layer"``)."""
        return (self.by_position if reference == "position" else self.by_layer).grouped()

    def to_frame(self, reference: str = "position") -> Any:
        """One row per massive activation (grouped as in :meth:`activations`)."""
        rows = [a.to_dict() for a in self.activations(reference)]
        keys = rows[0].keys() if rows else ("layer", "position", "channel", "value",
                                            "ratio_to_median", "max_abs", "count")
        return frame({k: [r[k] for r in rows] for k in keys})

    def to_dict(self) -> dict[str, Any]:
        mean_top3 = self.top3.double().mean(0)
        k = mean_top3.shape[1]
        return {
            "massive_criterion": {
                "hook": HOOKS[0], "abs_greater_than": ABS_THRESHOLD,
                "ratio_at_least": RATIO_THRESHOLD,
                "massive_activations": "median over channels of |x[l,p,:]| (the token's own)",
                "massive_activations_layer_median":
                    "median of |x[l]| over all positions and channels (Sun et al.'s code)",
            },
            "massive_activations": [a.to_dict() for a in self.activations("position")],
            "massive_activations_layer_median": [a.to_dict() for a in self.activations("layer")],
            "layer_magnitudes": {
                **{f"top{i + 1}": rounded_list(mean_top3[:, i]) for i in range(k)},
                "median": rounded_list(self.median.double().mean(0)),
            },
        }


def check_finite(resid: Float[Tensor, "layer batch pos d"]) -> None:
    """Raise, naming the first (layer, sequence, position, channel), where ``resid`` is not
    finite."""
    bad = ~torch.isfinite(resid)
    if not bad.any():
        return
    layer, seq, pos, channel = (int(i) for i in bad.nonzero()[0])
    raise BadInputError(
        f"the residual stream is {resid[layer, seq, pos, channel].item()} at layer {layer}, "
        f"sequence {seq}, position {pos}, channel {channel} in {str(resid.dtype)[6:]}: a "
        "massive activation beyond the half-precision range (float16 holds |x| <= 65504); "
        "load the model in bfloat16 or float32.")


def massive_activations(
    cache: CacheLike,
    abs_threshold: float = ABS_THRESHOLD,
    ratio_threshold: float = RATIO_THRESHOLD,
) -> MassiveReport:
    """Sun et al.'s massive activations and per-layer magnitudes, from ``hook_resid_post``.

    A residual entry that is not finite (a massive activation beyond float16's range, ±65504,
    overflows to inf) is a BadInputError naming where, not a silent inf in the report."""
    resid = stacked(cache, HOOKS[0])
    check_finite(resid)
    resid = resid.float()
    n = int(resid.shape[1])
    hits = [MassiveHits(n, *(t.cpu() for t in find_massive(resid, ref, abs_threshold,
                                                            ratio_threshold)))
            for ref in REFERENCES]
    top3, median = layer_magnitudes(resid)
    return MassiveReport(hits[0], hits[1], top3.cpu(), median.cpu())
