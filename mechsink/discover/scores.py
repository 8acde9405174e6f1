"""Edge scores and the steps every discovery method shares.

Every score estimates the same number: the change of the metric when that edge alone is
corrupted (the receiver reads the sender's corrupted write), ``m(edge corrupted) - m(clean)``.
The methods that compute them live in :mod:`mechsink.discover.methods`, one file each; this
module holds what they return (:class:`EdgeScores`) and what they share: the per-edge sum of
sender deltas times receiver gradients (:func:`from_grads`), the gradient at the clean run
(:func:`clean_gradients`) and the last step of a first-order method (:func:`finish`: AtP*'s
QK fix, :mod:`mechsink.discover.qkfix`, and ``verify=k``, which re-patches the ``k``
highest-scored edges exactly and reports how far each estimate was).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.discover.graph import Graph
from mechsink.discover.qkfix import qk_fixed
from mechsink.discover.run import GraphRun
from mechsink.errors import BadInputError
from mechsink.patching.attribution import correlation


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

    def __repr__(self) -> str:
        top = self.top(1)
        best = f", top={top[0][0]!r} ({top[0][1]:+.4g})" if top else ""
        corr = "None" if self.corrupted_value is None else f"{self.corrupted_value:.4g}"
        return (f"EdgeScores(method={self.method!r}, metric={self.metric!r}, "
                f"edges={len(self.values)}, clean={self.clean_value:.4g}, corrupted={corr}"
                f"{best})")

    def _repr_html_(self) -> str:
        """A card for Jupyter: the method, the baselines and the ten highest-|score| edges."""
        from html import escape

        rows = "".join(f"<tr><td>{escape(e)}</td><td>{v:+.4g}</td></tr>" for e, v in self.top(10))
        return (f"<div><b>EdgeScores</b> {escape(self.method)} &middot; metric "
                f"<code>{escape(self.metric)}</code> &middot; {len(self.values)} edges<br>"
                f"<table><tr><th>edge</th><th>score</th></tr>{rows}</table></div>")

    def order(self) -> Tensor:
        """Edges from the largest |score| down (ties keep graph order)."""
        return torch.argsort(self.values.abs(), descending=True, stable=True)

    def top(self, n: int) -> list[tuple[str, float]]:
        """The ``n`` highest-|score| edges with their scores."""
        return [(self.graph.edge_names[int(e)], float(self.values[e]))
                for e in self.order()[:n]]

    def check_summary(self) -> dict[str, Any]:
        """How the re-patched top edges compare: Spearman rank correlation (scipy's) and the
        largest absolute error, of the final and (with the QK fix) the first-order scores."""
        if not self.checks:
            return {}
        exact = torch.tensor([c["exact"] for c in self.checks], dtype=torch.float64)
        out: dict[str, Any] = {"k": len(self.checks)}
        for key in ("score", "first_order"):
            est = torch.tensor([c[key] for c in self.checks], dtype=torch.float64)
            out[key] = {"spearman": correlation(est, exact, "spearman"),
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


def from_grads(run: GraphRun, grads: dict[str, Tensor],
               deltas: dict[str, Tensor] | None = None) -> Float[Tensor, "sender receiver"]:
    """``delta_u . grad_v`` summed over batch and positions, for every sender/receiver pair
    (``grads`` per receiver hook, from :meth:`GraphRun.run_coeffs`; ``deltas`` per hook with
    ``keep_writes``, else the run's own ``delta``)."""
    g = run.graph
    out = torch.zeros(len(g.senders), len(g.receivers), dtype=torch.float64)
    for slot in run.slots():
        grad = grads.get(slot.hook)
        if grad is None:  # the metric does not read past this receiver
            continue
        n_s = g.n_senders_before(g.receivers[slot.cols[0]])
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


def on_edges(run: GraphRun, dense: Tensor) -> Tensor:
    """A ``[sender, receiver]`` matrix read at the graph's edges (``[edge]``)."""
    return dense[run.graph.src, run.graph.dst].clone()


def clean_gradients(run: GraphRun) -> dict[str, Tensor]:
    """The metric's gradient at the clean run (every coefficient 0), at every receiver hook
    and every attention pattern the QK fix reads: one forward, one backward."""
    g = run.graph
    coeffs = torch.zeros(1, len(g.senders), len(g.receivers))
    layers = list(range(g.n_layers)) + ([g.point.layer] if g.point.kind == "attn" else [])
    return run.run_coeffs(coeffs, with_grad=True, pattern_layers=layers)[1]


def result(run: GraphRun, values: Tensor, method: str, settings: dict[str, Any]) -> EdgeScores:
    """:class:`EdgeScores` of ``values`` with the run's settings (corruption, positions)."""
    settings = {**settings, "ablation": None if run.ablation is None else str(run.ablation),
                "positions": run.positions.nonzero().flatten().tolist(),
                "batch": run.batch, "seq_len": run.seq_len}
    return EdgeScores(run.graph, values, method, run.metric.name, run.clean_value,
                      run.corrupted_value, settings)


def check_verify(verify: Any) -> None:
    """``verify`` (edges to re-patch) is a non-negative integer."""
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        raise BadInputError(f"verify must be a non-negative integer, got {verify!r}.")


def finish(run: GraphRun, values: Tensor, method: str, settings: dict[str, Any],
           qk_fix: bool, verify: int, grads: dict[str, Tensor] | None) -> EdgeScores:
    """A first-order method's last step: the QK fix (with ``grads`` from
    :func:`clean_gradients`) and the exact re-patch of the ``verify`` top edges."""
    check_verify(verify)
    out = result(run, values, method, {**settings, "qk_fix": qk_fix})
    if qk_fix:
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
