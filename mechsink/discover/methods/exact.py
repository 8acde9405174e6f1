"""Exact edge patching: every edge patched alone (batched forwards from the receiver's layer),
the reference the estimates are checked against."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mechsink.discover.methods import EDGES, Option, register

if TYPE_CHECKING:
    from mechsink.discover.graph_run import GraphRun
    from mechsink.discover.scores import EdgeScores

#: how many patched runs share one forward (None: as many as the memory budget allows)
BATCH_SIZE = Option("batch_size", int, None, "patched runs per forward (default: as many as "
                    "the memory budget allows)", command_line=False, minimum=1)


@register("exact", options=(BATCH_SIZE, EDGES))
def exact_scores(run: GraphRun, *, batch_size: int | None = None,
                 edges: Sequence[int] | None = None) -> EdgeScores:
    """Every edge (or ``edges``; the others get NaN) patched alone: ``m(patched) - m(clean)``."""
    import torch

    from mechsink.discover.scores import result

    g = run.graph
    idx = list(range(g.n_edges)) if edges is None else [int(e) for e in edges]
    values = torch.full((g.n_edges,), math.nan, dtype=torch.float64)
    values[idx] = run.exact(idx, batch_size=batch_size) - run.clean_value
    return result(run, values, "exact", {}, scored=idx)
