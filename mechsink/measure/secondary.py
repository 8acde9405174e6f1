"""Secondary sinks: key positions after 0 that draw a sink's attention (Wong et al. 2026).

Per sequence, layer and key position ``k >= 1``:

- the sink score of ``k`` in every head, ``alpha_k[h] = mean_{i > k} A[h,i,k]`` (the queries
  after ``k``: query ``k`` itself would count a head that looks at its own token); reported as
  its largest value over heads and as the number of heads above ``eps``;
- the cosine of the residual state ``x[l,k]`` (``hook_resid_post``) to the first token's
  ``x[l,0]``;
- whether the massive channels of position 0 fire at ``k``: some channel that is massive at
  position 0 in some layer of the sequence (Sun et al. 2024's rule against the layer's median,
  as :mod:`mechsink.measure.massive`) is massive at ``(l, k)`` under the same rule.

``k`` is a *secondary sink in layer l* when at least one head scores it above ``eps`` (the
census's sink threshold, 0.3). Only keys with at least ``max(2, T // 4)`` later queries are
scored: near the end of the sequence a mean over one or two queries is a previous-token head,
not a sink. Its *layer span* is the set of layers where it is a sink (first, last, count).
With the tokens (the census gives them) the result names the tokens that become secondary
sinks, with counts over the sequences and how often each such token is one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.cache import CacheLike, rounded, rounded_list, stacked
from mechsink.measure.massive import ABS_THRESHOLD, RATIO_THRESHOLD, abs_median
from mechsink.measure.sinks import DEFAULT_EPS, check_eps

HOOKS = ("attn.hook_pattern", "hook_resid_post")
TOP_TOKENS = 20  # tokens listed in the JSON
TOP_EXAMPLES = 10  # occurrences listed in the JSON


def min_queries(seq_len: int) -> int:
    """How many later queries a key needs to be scored: ``max(2, T // 4)``."""
    return max(2, seq_len // 4)


def key_scores(pattern: Float[Tensor, "batch head query key"]) -> Float[Tensor, "batch head key"]:
    """``mean_{i > k} A[i, k]`` for every key ``k`` (NaN for the last key, which has no later
    query). Causal attention: ``A[i, k] = 0`` for ``i < k``."""
    t = pattern.shape[-1]
    p = pattern.float()
    later = p.sum(-2) - torch.diagonal(p, dim1=-2, dim2=-1)  # sum over i > k
    count = torch.arange(t - 1, -1, -1, device=p.device, dtype=p.dtype)  # T - 1 - k
    return later / count.masked_fill(count == 0, float("nan"))


def massive_mask(resid: Float[Tensor, "batch pos d_model"]) -> Bool[Tensor, "batch pos d_model"]:
    """Sun et al.'s rule against the layer's median over all positions and channels."""
    median = abs_median(resid.flatten(1))[:, None, None]
    return (resid.abs() > ABS_THRESHOLD) & (resid.abs() >= RATIO_THRESHOLD * median)


@dataclass(frozen=True)
class SecondarySinks:
    """Per sequence, layer and key position: the largest head sink score, the heads above
    ``eps``, the cosine to position 0 and whether position 0's massive channels fire; the
    decoded tokens when known. Positions that are not scored hold NaN / 0 (``scored``)."""

    top: Float[Tensor, "batch layer pos"]
    n_heads: Float[Tensor, "batch layer pos"]
    cosine: Float[Tensor, "batch layer pos"]
    fires: Bool[Tensor, "batch layer pos"]
    scored: Bool[Tensor, " pos"]
    eps: float = DEFAULT_EPS
    tokens: tuple[tuple[str, ...], ...] | None = None

    @classmethod
    def merge(cls, parts: Sequence[SecondarySinks]) -> SecondarySinks:
        tokens = None if any(p.tokens is None for p in parts) else \
            tuple(row for p in parts for row in p.tokens)  # type: ignore[union-attr]
        return cls(*(torch.cat([getattr(p, f) for p in parts]) for f in
                     ("top", "n_heads", "cosine", "fires")), parts[0].scored, parts[0].eps,
                   tokens)

    @property
    def sink(self) -> Bool[Tensor, "batch layer pos"]:
        """Whether key k is a secondary sink in layer l (some head scores it above eps)."""
        return self.n_heads > 0

    def occurrences(self) -> list[dict[str, Any]]:
        """Every (sequence, position) that is a secondary sink in some layer: its layer span,
        largest score, mean cosine to position 0 over its sink layers and whether position 0's
        massive channels fire there in one of them; most layers first."""
        any_layer = self.sink.any(1)
        rows = []
        for b, k in torch.nonzero(any_layer).tolist():
            layers = torch.nonzero(self.sink[b, :, k]).flatten().tolist()
            rows.append({
                "sequence": b, "position": k,
                "token": None if self.tokens is None else self.tokens[b][k],
                "layers": [layers[0], layers[-1]], "n_layers": len(layers),
                "max_score": rounded(self.top[b, :, k].max(), 4),
                "cosine_to_first": rounded(self.cosine[b, layers, k].double().mean(), 4),
                "massive_channels_fire": bool(self.fires[b, layers, k].any())})
        rows.sort(key=lambda r: (-r["n_layers"], -(r["max_score"] or 0.0)))
        return rows

    def by_token(self, rows: list[dict[str, Any]] | None = None) -> list[dict[str, Any]] | None:
        """Per token that becomes a secondary sink: how many times it does (``sinks``), how
        many times it occurs at a scored position (``occurrences``), the mean layer count and
        cosine; most sinks first (None without tokens)."""
        if self.tokens is None:
            return None
        rows = self.occurrences() if rows is None else rows
        seen = Counter(self.tokens[b][k] for b in range(len(self.tokens))
                       for k in torch.nonzero(self.scored).flatten().tolist())
        groups: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(r["token"], []).append(r)
        out = [{"token": tok, "sinks": len(g), "occurrences": seen[tok],
                "share": rounded(len(g) / seen[tok], 4),
                "mean_layers": rounded(sum(r["n_layers"] for r in g) / len(g), 4),
                "mean_cosine_to_first": rounded(
                    sum(r["cosine_to_first"] or 0.0 for r in g) / len(g), 4),
                "massive_channels_fire": sum(r["massive_channels_fire"] for r in g)}
               for tok, g in groups.items()]
        out.sort(key=lambda r: (-r["sinks"], r["token"]))
        return out

    def to_dict(self) -> dict[str, Any]:
        rows = self.occurrences()
        scored = self.scored
        k = torch.nonzero(scored).flatten().tolist()
        sink = self.sink[..., scored]
        cos = self.cosine[..., scored].double()
        tokens = self.by_token(rows)
        return {"secondary_sinks": {
            "criterion": (f"key k >= 1 with at least {min_queries(len(scored))} later queries is "
                          f"a sink in layer l when some head has mean_(i>k) A[i,k] > "
                          f"{self.eps:g}; cosine of hook_resid_post at k to position 0; massive: "
                          "a channel massive at position 0 (Sun et al., layer median) is "
                          "massive at (l, k)"),
            "positions": [k[0], k[-1]] if k else None,
            "rate": rounded(self.sink.any(1)[:, scored].double().mean()) if k else None,
            "rate_per_layer": rounded_list(sink.double().mean((0, 2))) if k else None,
            "top_score": rounded_list(self.top.double().nanmean(0), 4),
            "cosine_to_first": {"sinks": rounded(cos[sink].mean()) if sink.any() else None,
                                "other": rounded(cos[~sink].mean()) if (~sink).any() else None},
            "count": len(rows),
            "mean_layers": rounded(sum(r["n_layers"] for r in rows) / len(rows)) if rows
            else None,
            "massive_channels_fire": sum(r["massive_channels_fire"] for r in rows),
            "tokens": None if tokens is None else tokens[:TOP_TOKENS],
            "examples": rows[:TOP_EXAMPLES],
        }}


def secondary_sinks(
    cache: CacheLike, eps: float = DEFAULT_EPS, tokens: Tensor | None = None,
    decode: Callable[[Tensor], list[str]] | None = None,
) -> SecondarySinks:
    """The secondary-sink measurement of the module doc from ``attn.hook_pattern`` and
    ``hook_resid_post``; with ``tokens`` ``[batch, pos]`` and ``decode`` (one row of ids ->
    strings) the tokens are named."""
    check_eps(eps)
    pattern = stacked(cache, HOOKS[0])  # [layer, batch, head, query, key]
    resid = stacked(cache, HOOKS[1]).float()  # [layer, batch, pos, d_model]
    n_layers, batch, _, t, _ = pattern.shape
    if t < 3:
        raise BadInputError("secondary sinks need at least three positions.")
    if tokens is not None and tuple(tokens.shape) != (batch, t):
        raise BadInputError(f"tokens have shape {tuple(tokens.shape)}, the cache {batch} "
                            f"sequences of {t}.")
    scored = torch.zeros(t, dtype=torch.bool)
    scored[1:t - min_queries(t)] = True  # T - 1 - k >= min_queries
    scores = torch.stack([key_scores(pattern[layer]) for layer in range(n_layers)]).cpu()
    scores[..., ~scored] = float("nan")  # [layer, batch, head, key]
    top = scores.amax(2)
    n_heads = (scores > eps).sum(2).float()
    cosine = torch.nn.functional.cosine_similarity(resid, resid[:, :, :1], dim=-1).cpu()
    mask = torch.stack([massive_mask(resid[layer]) for layer in range(n_layers)])
    channels0 = mask[:, :, 0].any(0)  # [batch, d_model]: massive at position 0 somewhere
    fires = (mask & channels0[None, :, None, :]).any(-1).cpu()
    cosine[..., ~scored] = float("nan")
    fires[..., ~scored] = False
    names = None
    if tokens is not None and decode is not None:
        names = tuple(tuple(decode(row)) for row in tokens.cpu())
    return SecondarySinks(top.transpose(0, 1), n_heads.transpose(0, 1),
                          cosine.transpose(0, 1), fires.transpose(0, 1), scored, float(eps),
                          names)
