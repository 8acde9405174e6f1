"""Scores for every edge of the graph: EAP, EAP-IG and exact edge patching.

Every score estimates the same number: the change of the metric when that edge alone is
corrupted (the receiver reads the sender's corrupted write), ``m(edge corrupted) - m(clean)``.

- ``eap`` (Syed et al. 2023, "Attribution Patching Outperforms Automated Circuit Discovery"):
  ``(w_u^corr - w_u^clean) . dm/dx_v`` at the clean run, every edge from one forward and one
  backward pass.
- ``eap-ig`` (Hanna, Pezzelle and Belinkov 2024, "Have Faith in Faithfulness: Going Beyond
  Circuit Overlap When Finding Model Mechanisms"): the gradient averaged over ``steps``
  points between clean and corrupted (midpoint rule). ``ig="inputs"`` moves the input
  embedding (every receiver reads ``embed`` a fraction ``alpha`` corrupted) and multiplies by
  the clean-to-corrupted difference; ``ig="activations"`` moves every edge at once (the edge
  coefficients all at ``alpha``) and integrates the gradient of the metric with respect to the
  edge coefficients, so the scores add up to ``m(corrupted) - m(clean)`` as ``steps`` grows.
- ``exact``: every edge patched alone (batched forwards from the receiver's layer), the
  reference the two estimates are checked against.

First-order scores of edges into a saturated head's query or key miss what the softmax does
(its gradient vanishes where a pattern is saturated): ``qk_fix=True`` recomputes those heads'
patterns exactly (:mod:`mechsink.discover.qkfix`). ``verify=k`` re-patches the ``k``
highest-scored edges exactly and reports how far each estimate was.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.discover.graph import Graph
from mechsink.discover.run import GraphRun
from mechsink.errors import BadInputError

METHODS = ("eap", "eap-ig", "exact")


@dataclass
class EdgeScores:
    """One score per edge of ``graph`` (``m(edge corrupted) - m(clean)``, estimated or exact).

    ``first_order`` keeps the scores before the QK fix (None without it); ``checks`` holds
    the top edges re-patched exactly: edge, score, first-order score, exact effect.
    """

    graph: Graph
    values: Float[Tensor, " edge"]
    method: str
    metric: str
    clean_value: float
    corrupted_value: float | None
    settings: dict[str, Any] = field(default_factory=dict)
    first_order: Tensor | None = None
    checks: list[dict[str, Any]] = field(default_factory=list)

    def order(self) -> Tensor:
        """Edges from the largest |score| down (ties keep graph order)."""
        return torch.argsort(self.values.abs(), descending=True, stable=True)

    def top(self, n: int) -> list[tuple[str, float]]:
        """The ``n`` highest-|score| edges with their scores."""
        return [(self.graph.edge_names[int(e)], float(self.values[e]))
                for e in self.order()[:n]]

    def check_summary(self) -> dict[str, Any]:
        """How the re-patched top edges compare: Spearman rank correlation and the largest
        absolute error, of the final and (with the QK fix) the first-order scores."""
        if not self.checks:
            return {}
        exact = torch.tensor([c["exact"] for c in self.checks], dtype=torch.float64)
        out: dict[str, Any] = {"k": len(self.checks)}
        for key in ("score", "first_order"):
            est = torch.tensor([c[key] for c in self.checks], dtype=torch.float64)
            out[key] = {"spearman": spearman(est, exact),
                        "max_abs_error": float((est - exact).abs().max())}
        return out

    def to_dict(self, *, top: int | None = None) -> dict[str, Any]:
        order = self.order() if top is None else self.order()[:top]
        return {
            "method": self.method, "metric": self.metric, "clean_value": self.clean_value,
            "corrupted_value": self.corrupted_value, "settings": self.settings,
            "graph": self.graph.to_dict(),
            "edges": [{"edge": self.graph.edge_names[int(e)], "score": float(self.values[e]),
                       **({} if self.first_order is None else
                          {"first_order": float(self.first_order[e])})} for e in order],
            "checks": self.checks, "check_summary": self.check_summary(),
        }


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman rank correlation (no tie correction; NaN when one side is constant)."""
    if a.numel() < 2:
        return float("nan")
    ra = a.argsort().argsort().double()
    rb = b.argsort().argsort().double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = float(ra.norm() * rb.norm())
    return float((ra * rb).sum()) / den if den > 0 else float("nan")


def _from_grads(run: GraphRun, grads: dict[str, Tensor],
                deltas: dict[str, Tensor] | None = None) -> Float[Tensor, "sender receiver"]:
    """``delta_u . grad_v`` summed over batch and positions, for every sender/receiver."""
    g = run.graph
    out = torch.zeros(len(g.senders), len(g.receivers), dtype=torch.float64)
    for slot in run.slots():
        grad = grads.get(slot.hook)
        if grad is None:  # the metric does not read past this receiver
            continue
        r = g.receivers[slot.cols[0]]
        n_s = run.n_senders_before(r)
        d = (run.delta[:, :, :n_s] if deltas is None else deltas[slot.hook]).double()
        grad = grad.double()
        if slot.heads and slot.broadcast:
            grad = grad.sum(2)
        if slot.heads and not slot.broadcast:
            vals = torch.einsum("bsud,bshd->uh", d, grad)
        else:
            vals = torch.einsum("bsud,bsd->u", d, grad).unsqueeze(1)
        out[:n_s, slot.cols] += vals
    return out


def _edges(run: GraphRun, dense: Tensor) -> Tensor:
    return dense[run.graph.src, run.graph.dst].clone()


def eap(run: GraphRun, *, qk_fix: bool = True, verify: int = 20) -> EdgeScores:
    """Edge attribution patching at the clean run (one forward, one backward)."""
    g = run.graph
    coeffs = torch.zeros(1, len(g.senders), len(g.receivers))
    layers = list(range(g.n_layers)) + ([g.point.layer] if g.point.kind == "attn" else [])
    _, grads, _ = run.run_coeffs(coeffs, with_grad=True, pattern_layers=layers)
    values = _edges(run, _from_grads(run, grads))
    return _finish(run, values, "eap", {}, qk_fix, verify, grads)


def eap_ig(run: GraphRun, *, steps: int = 5, ig: str = "inputs", qk_fix: bool = False,
           verify: int = 20, edges: Sequence[int] | None = None) -> EdgeScores:
    """EAP-IG with ``steps`` interpolation points (midpoint rule), on ``"inputs"`` or
    ``"activations"`` (see the module doc). ``edges`` (activations only): interpolate these
    edges alone, the others stay clean (IG along one edge is its exact patch). ``qk_fix``
    replaces the scores of edges into queries and keys by AtP*'s estimate at the clean run
    (one more backward pass), as :func:`eap` does."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise BadInputError(f"steps must be a positive integer, got {steps!r}.")
    if ig not in ("inputs", "activations"):
        raise BadInputError(f"ig must be 'inputs' or 'activations', got {ig!r}.")
    if edges is not None and ig != "activations":
        raise BadInputError("edges= restricts the interpolated edges: use ig='activations'.")
    g = run.graph
    if edges is None:
        path = g.valid.clone().double() if ig == "activations" else torch.zeros(
            len(g.senders), len(g.receivers), dtype=torch.float64)
        if ig == "inputs":
            path[0] = g.valid[0].double()  # every edge out of the embedding
    else:
        sel = torch.zeros(g.n_edges, dtype=torch.float64)
        sel[torch.as_tensor(list(edges), dtype=torch.long)] = 1.0
        path = g.dense(sel)
    total = torch.zeros(len(g.senders), len(g.receivers), dtype=torch.float64)
    for k in range(steps):
        alpha = (k + 0.5) / steps
        _, grads, deltas = run.run_coeffs((alpha * path).unsqueeze(0), with_grad=True,
                                          keep_writes=ig == "activations")
        total += _from_grads(run, grads, deltas if ig == "activations" else None)
    values = _edges(run, total / steps)
    settings = {"steps": steps, "ig": ig}
    grads_clean = None
    if qk_fix:
        layers = list(range(g.n_layers)) + ([g.point.layer] if g.point.kind == "attn" else [])
        _, grads_clean, _ = run.run_coeffs(torch.zeros(1, len(g.senders), len(g.receivers)),
                                           with_grad=True, pattern_layers=layers)
    return _finish(run, values, "eap-ig", settings, qk_fix, verify, grads_clean)


def exact_scores(run: GraphRun, *, batch_size: int | None = None,
                 edges: Sequence[int] | None = None) -> EdgeScores:
    """Every edge (or ``edges``; the others get NaN) patched alone: ``m(patched) - m(clean)``."""
    g = run.graph
    idx = list(range(g.n_edges)) if edges is None else [int(e) for e in edges]
    values = torch.full((g.n_edges,), math.nan, dtype=torch.float64)
    values[idx] = run.exact(idx, batch_size=batch_size) - run.clean_value
    return _result(run, values, "exact", {})


def _result(run: GraphRun, values: Tensor, method: str, settings: dict[str, Any]) -> EdgeScores:
    settings = {**settings, "ablation": None if run.ablation is None else str(run.ablation),
                "positions": run.positions.nonzero().flatten().tolist(),
                "batch": run.batch, "seq_len": run.seq_len}
    return EdgeScores(run.graph, values, method, run.metric.name, run.clean_value,
                      run.corrupted_value, settings)


def _finish(run: GraphRun, values: Tensor, method: str, settings: dict[str, Any],
            qk_fix: bool, verify: int, grads: dict[str, Tensor] | None) -> EdgeScores:
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        raise BadInputError(f"verify must be a non-negative integer, got {verify!r}.")
    out = _result(run, values, method, {**settings, "qk_fix": qk_fix})
    if qk_fix:
        from mechsink.discover.qkfix import qk_fixed

        assert grads is not None
        out.first_order = values.clone()
        out.values = qk_fixed(run, values, grads)
    if verify:
        top = out.order()[:verify].tolist()
        exact = run.exact(top) - run.clean_value
        first = out.values if out.first_order is None else out.first_order
        out.checks = [{"edge": run.graph.edge_names[e], "score": float(out.values[e]),
                       "first_order": float(first[e]), "exact": float(x)}
                      for e, x in zip(top, exact.tolist(), strict=True)]
    return out


def score_edges(run: GraphRun, method: str, **kw: Any) -> EdgeScores:
    """Dispatch by name: ``"eap"``, ``"eap-ig"`` or ``"exact"``."""
    if method == "eap":
        return eap(run, **kw)
    if method == "eap-ig":
        return eap_ig(run, **kw)
    if method == "exact":
        return exact_scores(run, **kw)
    raise BadInputError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}.")
