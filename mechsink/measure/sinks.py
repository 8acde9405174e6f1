"""Sink score and sink rate (Gu et al. 2024, "When Attention Sink Emerges in Language Models").

``alpha_k = mean_{i >= k} A[i, k]``: the mean attention that queries at or after key position
``k`` pay to ``k``. Gu's version includes the query ``i = k`` (which, for ``k = 0``, attends to
itself with weight 1); ``include_self=False`` starts at ``i = k + 1``. The sink rate is the
fraction of (layer, head) with ``alpha_k > eps``, thresholded per sequence, then averaged.

**The default everywhere is Gu's version** (``include_self=True``): :func:`sink_score`,
:attr:`SinkScores.mean`, the census, :func:`mechsink.interventions.readout.sink_readout` and the
patching metric :class:`~mechsink.patching.SinkScore`; each takes ``include_self=False`` for the
other. (Use it when an intervention edits query ``k``'s own attention, e.g.
``attend_only_to_self``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.cache import CacheLike, grid_frame, rounded, rounded_list, stacked
from mechsink.measure.wide import wide

HOOKS = ("attn.hook_pattern",)
DEFAULT_EPS = 0.3


def sink_score(
    pattern: Float[Tensor, "batch head query key"],
    position: int | None = None,
    *,
    include_self: bool = True,
) -> Float[Tensor, "batch head"]:
    """Per sequence and head, the mean attention paid to key ``position`` (default 0) by the
    queries at (``include_self``, Gu's version, the default) or after it (averaged in float32
    at least, whatever the pattern's dtype)."""
    key_pos = 0 if position is None else int(position)
    n_query = pattern.shape[-2]
    if not 0 <= key_pos < pattern.shape[-1]:
        raise BadInputError(
            f"position={key_pos} is outside the sequence (length {pattern.shape[-1]})."
        )
    first = key_pos if include_self else key_pos + 1
    if first >= n_query:
        raise BadInputError(
            f"no query comes after position={key_pos} in a sequence of {n_query} tokens: "
            "use a longer sequence or include_self=True."
        )
    return wide(pattern[..., first:, key_pos]).mean(dim=-1)


def check_eps(eps: float) -> None:
    """Raise unless ``0 < eps < 1`` (a sink threshold on an attention weight)."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0.0 < eps < 1.0:
        raise BadInputError(f"eps must lie strictly between 0 and 1, got {eps!r}.")


def sink_rate(
    scores: Float[Tensor, "batch layer head"], eps: float = DEFAULT_EPS
) -> float:
    """Fraction of (layer, head) pairs with sink score above ``eps``, thresholded per sequence
    and then averaged over sequences (Gu et al. 2024)."""
    check_eps(eps)
    return (scores > eps).to(torch.float64).mean().item()


@dataclass(frozen=True)
class SinkScores:
    """Per-sequence sink scores of one key position, both versions, for every layer and head.

    :attr:`mean` and :attr:`rate` are Gu's version (the default everywhere);
    :meth:`score` and :meth:`rate_of` take ``include_self`` to choose.
    """

    position: int
    eps: float
    gu: Float[Tensor, "batch layer head"]  # queries i >= position (Gu's version)
    no_self: Float[Tensor, "batch layer head"]  # queries i > position

    def __repr__(self) -> str:
        batch, layers, heads = (int(n) for n in self.gu.shape)
        top = self.top_heads(1)
        best = f", top=L{top[0][0]}H{top[0][1]} ({top[0][2]:.3f})" if top else ""
        return (f"SinkScores(position={self.position}, {batch} sequences x {layers} layers x "
                f"{heads} heads, eps={self.eps:g}, rate={self.rate:.3f}{best})")

    def _repr_html_(self) -> str:
        """A card for Jupyter: the sink rate and the ten highest-scoring heads."""
        from html import escape

        rows = "".join(f"<tr><td>L{lay}H{h}</td><td>{v:.4f}</td></tr>"
                       for lay, h, v in self.top_heads(10))
        return (f"<div><b>{escape(repr(self))}</b><table><tr><th>head</th>"
                f"<th>sink score</th></tr>{rows}</table></div>")

    @classmethod
    def merge(cls, parts: Sequence[SinkScores]) -> SinkScores:
        """Concatenate chunks of sequences measured with the same settings."""
        first = parts[0]
        return cls(first.position, first.eps, torch.cat([p.gu for p in parts]),
                   torch.cat([p.no_self for p in parts]))

    def per_sequence(self, include_self: bool = True) -> Float[Tensor, "batch layer head"]:
        """Per-sequence scores: Gu's version (default) or the one from query ``k + 1``."""
        return self.gu if include_self else self.no_self

    def score(self, include_self: bool = True) -> Float[Tensor, "layer head"]:
        """The sink score averaged over sequences (Gu's version unless ``include_self=False``)."""
        return self.per_sequence(include_self).mean(0)

    def rate_of(self, include_self: bool = True) -> float:
        """The sink rate of one version (Gu's by default)."""
        return sink_rate(self.per_sequence(include_self), self.eps)

    @property
    def mean(self) -> Float[Tensor, "layer head"]:
        """Gu's sink score averaged over sequences (``score(include_self=False)``: the other)."""
        return self.gu.mean(0)

    @property
    def rate(self) -> float:
        return sink_rate(self.gu, self.eps)

    @property
    def rate_no_self(self) -> float:
        return sink_rate(self.no_self, self.eps)

    def top_heads(self, k: int) -> list[tuple[int, int, float]]:
        """The ``k`` (layer, head, mean score) with the highest mean Gu score, best first."""
        flat = self.mean.flatten()
        n_heads = self.mean.shape[1]
        idx = torch.argsort(flat, descending=True, stable=True)[:k]
        return [(int(i) // n_heads, int(i) % n_heads, float(flat[i])) for i in idx]

    def to_frame(self) -> Any:
        """One row per (layer, head): both sink scores (mean over sequences) and the fraction
        of sequences in which each version exceeds ``eps``."""
        return grid_frame(("layer", "head"), {
            "sink_score": self.gu.mean(0), "sink_score_no_self": self.no_self.mean(0),
            "above_eps": (self.gu > self.eps).double().mean(0),
            "above_eps_no_self": (self.no_self > self.eps).double().mean(0)})

    def to_dict(self) -> dict[str, Any]:
        return {
            "key_position": self.position,
            "eps": self.eps,
            "sink_score": rounded_list(self.mean),
            "sink_score_no_self": rounded_list(self.no_self.mean(0)),
            "sink_rate": rounded(self.rate),
            "sink_rate_no_self": rounded(self.rate_no_self),
            "sink_rate_per_layer": rounded_list((self.gu > self.eps).double().mean(dim=(0, 2))),
        }


def sink_scores(
    cache: CacheLike, position: int | None = None, eps: float = DEFAULT_EPS,
) -> SinkScores:
    """Both sink-score versions of key ``position`` (default 0) for every layer and head, from
    ``attn.hook_pattern``."""
    key_pos = 0 if position is None else int(position)
    check_eps(eps)
    pattern = stacked(cache, HOOKS[0])  # [layer, batch, head, query, key]
    n_layers, batch = pattern.shape[:2]
    flat = pattern.flatten(0, 1)

    def per_seq(include_self: bool) -> Tensor:
        score = sink_score(flat, key_pos, include_self=include_self)
        return score.reshape(n_layers, batch, -1).transpose(0, 1).float().cpu()

    return SinkScores(key_pos, float(eps), per_seq(True), per_seq(False))
