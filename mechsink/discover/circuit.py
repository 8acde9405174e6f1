"""Circuits as sets of edges: selection (top-n by score, or greedy with exact evaluation),
evaluation by corrupting every edge outside the circuit, node circuits as edge sets, JSON.

A circuit's *faithfulness* is the normalised metric with every edge outside it corrupted:
``(m(circuit) - m(empty)) / (m(clean) - m(empty))``, 1 when the circuit alone carries the
clean behaviour and 0 when it carries nothing (Conmy et al. 2023, "Towards Automated Circuit
Discovery"; Hanna et al. 2024). ``m(empty)`` corrupts every edge.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Bool
from torch import Tensor

from mechsink.discover.graph import Graph
from mechsink.discover.graph_run import GraphRun
from mechsink.discover.scores import EdgeScores, json_float
from mechsink.errors import BadInputError
from mechsink.io import atomic_write_json
from mechsink.model import true_dtype
from mechsink.patching.checks import noise_floor

SCHEMA = "mechsink-edge-circuit/1"


@dataclass
class Circuit:
    """Edges of ``graph`` kept (by number), how they were chosen and how faithful they are."""

    graph: Graph
    edges: list[int]
    how: str
    faithfulness: float | None = None
    scores: Tensor | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [self.graph.edge_names[e] for e in self.edges]

    def nodes(self) -> list[str]:
        """Senders and receivers the circuit touches (receivers by name)."""
        g = self.graph
        out: dict[str, None] = {}
        for e in self.edges:
            out[g.senders[int(g.src[e])].name] = None
            out[g.receivers[int(g.dst[e])].name] = None
        return list(out)

    def mask(self) -> Bool[Tensor, " edge"]:
        keep = torch.zeros(self.graph.n_edges, dtype=torch.bool)
        keep[self.edges] = True
        return keep

    def to_dict(self) -> dict[str, Any]:
        g = self.graph
        rows = []
        for e in self.edges:
            row: dict[str, Any] = {"edge": g.edge_names[e],
                                   "sender": g.senders[int(g.src[e])].name,
                                   "receiver": g.receivers[int(g.dst[e])].name}
            if self.scores is not None:
                row["score"] = json_float(self.scores[e])
            rows.append(row)
        faith = None if self.faithfulness is None else json_float(self.faithfulness)
        return {"schema": SCHEMA, "how": self.how, "n_edges": len(self.edges),
                "faithfulness": faith, "graph": g.to_dict(), "edges": rows,
                "meta": self.meta}

    def save(self, path: str | Path) -> Path:
        """Write the circuit as JSON (atomically)."""
        path = Path(path)
        atomic_write_json(path, self.to_dict())
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any], graph: Graph | None = None, *,
                  scores: Tensor | None = None) -> Circuit:
        """The circuit :meth:`to_dict` wrote, without the model: its graph rebuilt from the
        JSON (or ``graph``), the kept edges by name, and ``scores`` (every edge) or the kept
        edges' own scores (the others NaN)."""
        if data.get("schema") != SCHEMA:
            raise BadInputError(f"not a mechsink circuit (schema {data.get('schema')!r}, "
                                f"expected {SCHEMA!r}).")
        graph = Graph.from_dict(data["graph"]) if graph is None else graph
        edges = edges_from_names(graph, (str(r["edge"]) for r in data["edges"]))
        if scores is None and any(r.get("score") is not None for r in data["edges"]):
            scores = torch.full((graph.n_edges,), math.nan, dtype=torch.float64)
            for e, r in zip(edges, data["edges"], strict=True):
                if r.get("score") is not None:
                    scores[e] = float(r["score"])
        faith = data.get("faithfulness")
        return cls(graph, edges, str(data.get("how", "")),
                   None if faith is None else float(faith), scores, dict(data.get("meta") or {}))

    @classmethod
    def load(cls, path: str | Path) -> Circuit:
        """A circuit saved by :meth:`save` (``circuit.json`` of ``mechsink discover``), with
        its graph and scores, no model needed."""
        return cls.from_dict(read_json(path))


def read_json(path: str | Path) -> Any:
    """A saved discovery file's JSON; a missing or unreadable file is one clear line."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInputError(f"cannot read {path}: {exc}.") from None


def edges_from_names(graph: Graph, names: Iterable[str]) -> list[int]:
    """Edge numbers from names such as ``"L0H1->L2H0.q"`` (a circuit JSON's ``edge`` fields)."""
    return [graph.edge_index(n) for n in names]


#: a clean-to-empty gap below this fraction of the metric's size is flagged "weak": corrupting
#: every edge barely moves the metric, so a faithfulness (a ratio of two small differences)
#: says little about the circuit, however finite it is
WEAK_GAP = 1e-2


def faithfulness(run: GraphRun, keeps: Bool[Tensor, "n edge"], *,
                 batch: int | None = None) -> Tensor:
    """Normalised metric for each row of edges kept (every other edge corrupted); NaN when the
    clean-to-empty gap is within float noise (the rule activation patching's ``normalize``
    refuses by: :func:`mechsink.patching.checks.noise_floor`)."""
    full, empty = run.clean_value, run.empty_value
    values = run.mask_values(keeps, batch=batch)
    if not abs(full - empty) > noise_floor(max(abs(full), abs(empty)), true_dtype(run.model)):
        return torch.full_like(values, math.nan)
    return (values - empty) / (full - empty)


def gap(run: GraphRun) -> dict[str, Any]:
    """The clean and empty values faithfulness divides by, their gap relative to the metric's
    size, and what it allows: ``"noise"`` (within float noise: faithfulness is NaN, as
    activation patching refuses to normalise), ``"weak"`` (below :data:`WEAK_GAP` of the
    metric's size: the corruption hardly moves the metric, so faithfulness values are ratios
    of small differences; the summary and the command line say so) or ``"ok"``."""
    full, empty = run.clean_value, run.empty_value
    scale = max(abs(full), abs(empty))
    span = abs(full - empty)
    relative = span / scale if scale > 0 else 0.0
    status = ("noise" if not span > noise_floor(scale, true_dtype(run.model))
              else "weak" if relative < WEAK_GAP else "ok")
    return {"clean": full, "empty": empty, "relative": relative, "status": status}


def gap_note(g: dict[str, Any]) -> str | None:
    """One line on a gap :func:`gap` did not find ``"ok"`` (None when it did)."""
    if g.get("status") in (None, "ok"):
        return None
    what = ("within float noise: faithfulness is undefined (null)" if g["status"] == "noise"
            else f"{g['relative']:.2%} of the metric's size (below {WEAK_GAP:.0%}): the "
            "corruption hardly moves this metric, so faithfulness values are ratios of small "
            "differences; pick a metric or corruption the behaviour depends on")
    return (f"faithfulness divides by m(clean) - m(every edge corrupted) = {g['clean']:.6g} - "
            f"{g['empty']:.6g}, a gap {what}.")


def top_n(scores: EdgeScores, n: int) -> Circuit:
    """The ``n`` edges with the largest |score|."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= scores.graph.n_edges:
        raise BadInputError(f"n must be an integer in 0..{scores.graph.n_edges}, got {n!r}.")
    return Circuit(scores.graph, scores.order()[:n].tolist(), f"top-{n} by {scores.method}",
                   scores=scores.values)


def greedy(run: GraphRun, scores: EdgeScores, *, target: float = 0.9, window: int = 8,
           max_edges: int | None = None, batch: int | None = None) -> Circuit:
    """Grow a circuit one edge at a time: among the next ``window`` edges by |score|, add the
    one whose addition gives the highest faithfulness (exactly evaluated); stop at ``target``
    or ``max_edges``. Costs about ``window`` forwards per edge added."""
    if window < 1:
        raise BadInputError(f"window must be at least 1, got {window}.")
    g = run.graph
    limit = g.n_edges if max_edges is None else min(max_edges, g.n_edges)
    remaining = scores.order().tolist()
    chosen: list[int] = []
    faith = float(faithfulness(run, torch.zeros(1, g.n_edges, dtype=torch.bool))[0])
    while remaining and len(chosen) < limit and not faith >= target:
        cands = remaining[:window]
        keeps = torch.zeros(len(cands), g.n_edges, dtype=torch.bool)
        keeps[:, chosen] = True
        keeps[torch.arange(len(cands)), cands] = True
        f = faithfulness(run, keeps, batch=batch)
        best = int(torch.nan_to_num(f, nan=-math.inf).argmax())
        chosen.append(cands[best])
        remaining.remove(cands[best])
        faith = float(f[best])
    return Circuit(g, chosen, f"greedy from {scores.method} (target {target}, window {window})",
                   faithfulness=faith, scores=scores.values)


def node_circuit_edges(graph: Graph, members: Sequence[str]) -> list[int]:
    """The edges a *node* circuit keeps: from the embedding or a member to a member's input
    (a head's query, its KV head's key/value, an MLP's input) or to the metric. Members are
    named ``L3H1`` and ``MLP2`` (:mod:`mechsink.discover.node_search`'s components)."""
    names = set(members)
    group = graph.n_heads // graph.n_kv

    def reads(r: Any) -> bool:
        if r.kind == "metric":
            return True
        if r.kind == "mlp":
            return f"MLP{r.layer}" in names
        if r.kind == "q":
            return f"L{r.layer}H{r.index}" in names
        heads = range(r.index * group, (r.index + 1) * group)
        return any(f"L{r.layer}H{h}" in names for h in heads)

    keep = []
    for e in range(graph.n_edges):
        s, r = graph.senders[int(graph.src[e])], graph.receivers[int(graph.dst[e])]
        if (s.kind == "embed" or s.name in names) and reads(r):
            keep.append(e)
    return keep
