"""Faithfulness curves: the normalised metric against the number of edges kept, for a ranking
of the edges, with a random-circuit baseline and the area under each curve.

Circuit-faithfulness numbers move with the ablation that replaces the edges left out (Miller,
Chughtai and Saunders 2024, "Transformer Circuit Faithfulness Metrics Are Not Robust"), so a
curve is drawn per ablation type; the random baseline keeps random edge sets of the same sizes
(Conmy et al. 2023 compare against it too). AUC: the trapezoid area under the curve over the
*fraction* of edges kept (0..1) on the sizes measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mechsink.discover.circuit import faithfulness
from mechsink.discover.graph_run import GraphRun
from mechsink.errors import BadInputError


@dataclass(frozen=True)
class Curve:
    """One faithfulness curve: sizes (edges kept), the ranking's values, the random baseline
    (mean and standard deviation over ``n_random`` draws), and both AUCs."""

    label: str
    ablation: str
    n_edges: int
    sizes: list[int]
    values: list[float]
    random_mean: list[float]
    random_std: list[float]
    auc: float
    random_auc: float
    clean_value: float
    empty_value: float

    def size_reaching(self, level: float) -> int | None:
        """The first measured size whose faithfulness is at least ``level`` (None: never)."""
        for s, v in zip(self.sizes, self.values, strict=True):
            if v >= level:
                return s
        return None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Curve:
        """The curve :meth:`to_dict` wrote (a null AUC, from a vanishing clean-to-empty gap,
        reads back as NaN)."""
        nan = _number
        return cls(str(data["label"]), str(data["ablation"]), int(data["n_edges"]),
                   [int(s) for s in data["sizes"]], [nan(v) for v in data["values"]],
                   [nan(v) for v in data["random_mean"]], [nan(v) for v in data["random_std"]],
                   nan(data["auc"]), nan(data["random_auc"]), nan(data["clean_value"]),
                   nan(data["empty_value"]))

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "ablation": self.ablation, "n_edges": self.n_edges,
                "sizes": self.sizes, "values": self.values, "random_mean": self.random_mean,
                "random_std": self.random_std, "auc": self.auc, "random_auc": self.random_auc,
                "clean_value": self.clean_value, "empty_value": self.empty_value}


def _number(x: Any) -> float:
    """A JSON number, ``null`` (a non-finite value written strictly) read back as NaN."""
    return math.nan if x is None else float(x)


def default_sizes(n_edges: int, points: int = 14, extra: Sequence[int] = ()) -> list[int]:
    """0, geometric steps up to ``n_edges``, the quarter points, and ``extra``."""
    sizes = {0, n_edges} | {int(round(n_edges * f)) for f in (0.25, 0.5, 0.75)}
    sizes |= {int(round(n_edges ** (i / (points - 1)))) for i in range(points)}
    sizes |= {int(s) for s in extra if 0 <= s <= n_edges}
    return sorted(sizes)


def auc(sizes: Sequence[int], values: Sequence[float], n_edges: int) -> float:
    """Trapezoid area under ``values`` over the fraction of edges kept."""
    if n_edges <= 0 or len(sizes) < 2:
        return math.nan
    x = [s / n_edges for s in sizes]
    return float(sum((x[i + 1] - x[i]) * (values[i] + values[i + 1]) / 2
                     for i in range(len(x) - 1)))


def curve(run: GraphRun, order: Sequence[int], *, label: str = "circuit",
          sizes: Sequence[int] | None = None, n_random: int = 3, seed: int = 0,
          batch: int | None = None) -> Curve:
    """The faithfulness of the first ``k`` edges of ``order`` for each ``k`` in ``sizes``
    (default :func:`default_sizes`), and of ``n_random`` random edge sets per size. Edges not in
    ``order`` come last (in graph order) when a size needs more."""
    g = run.graph
    n = g.n_edges
    order = [int(e) for e in order]
    if len(set(order)) != len(order) or any(not 0 <= e < n for e in order):
        raise BadInputError("order must list distinct edge numbers of the graph.")
    in_order = set(order)
    rest = [e for e in range(n) if e not in in_order]
    full = order + rest
    sizes = default_sizes(n) if sizes is None else sorted({int(s) for s in sizes})
    if any(not 0 <= s <= n for s in sizes):
        raise BadInputError(f"sizes must lie in 0..{n}.")
    keeps = torch.zeros(len(sizes), n, dtype=torch.bool)
    for i, s in enumerate(sizes):
        keeps[i, full[:s]] = True
    gen = torch.Generator().manual_seed(seed)
    rand = torch.zeros(len(sizes), n, dtype=torch.bool).repeat(max(n_random, 0), 1, 1)
    for r in range(max(n_random, 0)):
        for i, s in enumerate(sizes):
            rand[r, i, torch.randperm(n, generator=gen)[:s]] = True
    # the ordered and the random rows in one call: stacked together, and run once where equal
    every = faithfulness(run, torch.cat([keeps, rand.flatten(0, 1)]), batch=batch)
    values = every[:len(sizes)].tolist()
    if n_random > 0:
        rv = every[len(sizes):].view(n_random, len(sizes))
        mean, std = rv.mean(0).tolist(), (rv.std(0) if n_random > 1 else rv[0] * 0).tolist()
    else:
        mean = std = [math.nan] * len(sizes)
    abl = "counterfactual" if run.ablation is None else str(run.ablation)
    return Curve(label, abl, n, list(sizes), values, mean, std, auc(sizes, values, n),
                 auc(sizes, mean, n), run.clean_value, run.empty_value)


def sets_curve(run: GraphRun, sets: Sequence[Sequence[int]], *, label: str,
               n_random: int = 3, seed: int = 0, batch: int | None = None) -> Curve:
    """The faithfulness of given edge sets (e.g. a node circuit grown one node at a time),
    at their sizes, with random sets of the same sizes as the baseline."""
    g = run.graph
    n = g.n_edges
    keeps = torch.zeros(len(sets), n, dtype=torch.bool)
    for i, s in enumerate(sets):
        keeps[i, [int(e) for e in s]] = True
    sizes = [int(k.sum()) for k in keeps]
    if sizes != sorted(sizes):
        raise BadInputError("edge sets must come in order of size (a growing circuit).")
    gen = torch.Generator().manual_seed(seed)
    rows = [keeps]
    for _ in range(max(n_random, 0)):
        for s in sizes:
            row = torch.zeros(1, n, dtype=torch.bool)
            row[0, torch.randperm(n, generator=gen)[:s]] = True
            rows.append(row)
    every = faithfulness(run, torch.cat(rows), batch=batch)  # one call, equal rows run once
    values = every[:len(sizes)].tolist()
    if n_random > 0:
        rv = every[len(sizes):].view(n_random, len(sizes))
        mean, std = rv.mean(0).tolist(), (rv.std(0) if n_random > 1 else rv[0] * 0).tolist()
    else:
        mean = std = [math.nan] * len(sizes)
    abl = "counterfactual" if run.ablation is None else str(run.ablation)
    return Curve(label, abl, n, sizes, values, mean, std, auc(sizes, values, n),
                 auc(sizes, mean, n), run.clean_value, run.empty_value)
