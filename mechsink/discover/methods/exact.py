"""Exact edge patching: every edge patched alone (batched forwards from the receiver's layer),
the reference the estimates are checked against."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from mechsink.discover.graph_run import GraphRun
from mechsink.discover.methods import register
from mechsink.discover.scores import EdgeScores, result


@register("exact")
def exact_scores(run: GraphRun, *, batch_size: int | None = None,
                 edges: Sequence[int] | None = None) -> EdgeScores:
    """Every edge (or ``edges``; the others get NaN) patched alone: ``m(patched) - m(clean)``."""
    g = run.graph
    idx = list(range(g.n_edges)) if edges is None else [int(e) for e in edges]
    values = torch.full((g.n_edges,), math.nan, dtype=torch.float64)
    values[idx] = run.exact(idx, batch_size=batch_size) - run.clean_value
    return result(run, values, "exact", {}, scored=idx)
