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

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.discover import plain_grads
from mechsink.discover.graph import Graph
from mechsink.discover.graph_run import GraphRun
from mechsink.discover.qkfix import qk_fixed
from mechsink.errors import BadInputError, MechsinkWarning
from mechsink.model import true_dtype
from mechsink.model.precision import overflow_advice
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
        """Edges from the largest |score| down (ties keep graph order; edges without a
        finite score, e.g. not scored by ``exact(edges=...)``, last)."""
        key = torch.where(torch.isfinite(self.values), self.values.abs(), -1.0)
        return torch.argsort(key, descending=True, stable=True)

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
            rho = json_float(correlation(est, exact, "spearman"))
            out[key] = {"spearman": rho, "max_abs_error": float((est - exact).abs().max())}
            if rho is None:
                out[key]["reason"] = "fewer than two edges, or one side constant"
        return out

    def to_dict(self, *, top: int | None = None) -> dict[str, Any]:
        """JSON-ready (strict: an edge without a finite score has ``"score": null`` and a
        ``"reason"``)."""
        order = self.order() if top is None else self.order()[:top]
        rows = []
        for e in order.tolist():
            row: dict[str, Any] = {"edge": self.graph.edge_names[e],
                                   "score": json_float(self.values[e])}
            if row["score"] is None:
                row["reason"] = NOT_SCORED
            if self.first_order is not None:
                row["first_order"] = json_float(self.first_order[e])
            rows.append(row)
        return {
            "method": self.method, "metric": self.metric, "clean_value": self.clean_value,
            "corrupted_value": self.corrupted_value, "settings": self.settings,
            "graph": self.graph.to_dict(), "edges": rows,
            "checks": self.checks, "check_summary": self.check_summary(),
        }


    @classmethod
    def from_dict(cls, data: dict[str, Any], graph: Graph | None = None, *,
                  values: Tensor | None = None, first_order: Tensor | None = None
                  ) -> EdgeScores:
        """Scores :meth:`to_dict` wrote, without the model: ``values`` (every edge, as
        :meth:`mechsink.discover.Discovery.save` keeps them beside the JSON) or, without it,
        the edges the JSON lists (the others NaN: not scored, ranked last)."""
        graph = Graph.from_dict(data["graph"]) if graph is None else graph
        rows = data.get("edges", [])
        if values is None:
            values = _from_rows(graph, rows, "score")
        if first_order is None and any("first_order" in r for r in rows):
            first_order = _from_rows(graph, rows, "first_order")
        if values.shape != (graph.n_edges,):
            raise BadInputError(f"{values.numel()} scores for a graph of {graph.n_edges} edges.")
        return cls(graph, values, str(data.get("method")), str(data.get("metric")),
                   float(data["clean_value"]), None if data.get("corrupted_value") is None
                   else float(data["corrupted_value"]), dict(data.get("settings") or {}),
                   first_order, list(data.get("checks") or []))


def _from_rows(graph: Graph, rows: Sequence[dict[str, Any]], key: str) -> Tensor:
    """One value per edge from JSON rows naming edges (``null`` and absent edges: NaN)."""
    out = torch.full((graph.n_edges,), math.nan, dtype=torch.float64)
    for row in rows:
        if row.get(key) is not None:
            out[graph.edge_index(str(row["edge"]))] = float(row[key])
    return out


#: why an edge's score is ``null`` in JSON (scores that turn non-finite are refused earlier)
NOT_SCORED = "not scored (the method scored a subset of the edges)"


def json_float(x: Any) -> float | None:
    """``float(x)``, or None when it is not finite (JSON has no NaN)."""
    f = float(x)
    return f if math.isfinite(f) else None


def strict_json(data: Any, reason: str, where: str = "") -> tuple[Any, list[str]]:
    """``data`` with every non-finite float replaced by None, and the JSON paths replaced
    (so a writer can add ``{"non_finite": {"paths": ..., "reason": reason}}``)."""
    paths: list[str] = []

    def walk(x: Any, at: str) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            paths.append(at)
            return None
        if isinstance(x, dict):
            return {k: walk(v, f"{at}.{k}" if at else str(k)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v, f"{at}[{i}]") for i, v in enumerate(x)]
        return x

    return walk(data, where), paths


def fmt(x: float | None, spec: str = ".3f") -> str:
    """A number for a summary; ``n/a`` for None or NaN."""
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def from_grads(run: GraphRun, grads: dict[str, Tensor],
               deltas: dict[str, Tensor] | None = None) -> Float[Tensor, "sender receiver"]:
    """``delta_u . grad_v`` summed over batch and positions, for every sender/receiver pair
    (``grads`` per receiver hook, from :meth:`GraphRun.run_coeffs`; ``deltas`` per hook with
    ``keep_writes``, else the run's own ``delta``).

    With the run's own delta this is a few large matrix products in float64: the tokens (batch
    x corrupted positions: ``delta`` is exactly 0 elsewhere) in blocks of about 64 MiB, each
    block's deltas ``[sender, token * d_model]`` and every receiver column's gradients
    ``[column, token * d_model]`` converted once, and the senders in four bands, each
    multiplied by the columns of the receivers reading after the band's first sender (the
    product's lower triangle is most of the work saved; the few entries of a band's senders
    that do not reach a receiver are set to 0 at the end)."""
    if deltas is not None:
        return _from_slot_deltas(run, grads, deltas)
    g = run.graph
    n_senders = len(g.senders)
    out = torch.zeros(n_senders, len(g.receivers), dtype=torch.float64)
    columns = sorted(grad_columns(run, grads), key=lambda col: col[0])  # stable
    if not columns:
        return out
    limits = torch.tensor([n for n, idx, _ in columns for _ in idx])  # senders before each
    idx = torch.tensor([i for _, cols, _ in columns for i in cols])
    n_max, n_cols = int(limits.max()), len(idx)
    delta = token_rows(run, run.delta)  # [token, sender, d_model]
    n_tok, d = delta.shape[0], delta.shape[-1]
    per = min(n_tok, max(1, (64 << 20) // max(1, (n_max + n_cols) * d * 8)))
    bands = [(lo, min(n_max, lo + -(-n_max // 4))) for lo in range(0, n_max, -(-n_max // 4))]
    firsts = [int((limits > lo).nonzero()[0, 0]) for lo, _ in bands]  # columns sorted by limit
    # two buffers reused for every block: fresh memory is paid for once, not per block
    dm_buf = torch.empty(n_max * per * d, dtype=torch.float64)
    gm_buf = torch.empty(n_cols * per * d, dtype=torch.float64)
    for t0 in range(0, n_tok, per):
        t1 = min(n_tok, t0 + per)
        dm = dm_buf[:n_max * (t1 - t0) * d].view(n_max, t1 - t0, d)
        gm = gm_buf[:n_cols * (t1 - t0) * d].view(n_cols, t1 - t0, d)
        dm.copy_(delta[t0:t1, :n_max].transpose(0, 1))
        c = 0
        for _, cols, grad in columns:  # grad [token, columns, d_model]
            gm[c:c + len(cols)].copy_(grad[t0:t1].transpose(0, 1))
            c += len(cols)
        dm, gm = dm.view(n_max, -1), gm.view(n_cols, -1)
        for (lo, hi), first in zip(bands, firsts, strict=True):
            out[lo:hi].index_add_(1, idx[first:], dm[lo:hi] @ gm[first:].T)
    reach = torch.zeros_like(out, dtype=torch.bool)
    reach[:, idx] = torch.arange(n_senders).unsqueeze(1) < limits.unsqueeze(0)
    return out.masked_fill_(~reach, 0.0)


def token_rows(run: GraphRun, act: Tensor) -> Tensor:
    """``[batch, pos, ...]`` as ``[token, ...]`` over the corrupted positions only (a view
    when every position is corrupted)."""
    if bool(run.positions.all()):
        return act.flatten(0, 1)
    pos = run.positions.nonzero().flatten().to(act.device)
    return act.index_select(1, pos).flatten(0, 1)


def grad_columns(run: GraphRun, grads: dict[str, Tensor], after_stage: int = -1
                 ) -> list[tuple[int, list[int], Tensor]]:
    """Each receiver slot's gradient, in forward order, as ``(senders before it, receiver
    columns, [token, column, d_model])`` (tokens as :func:`token_rows`); only slots that got
    a gradient and whose receivers read after sender stage ``after_stage``. A slot reading one
    column for every head (the metric at an attention input) has its heads' gradients
    summed."""
    g = run.graph
    out = []
    for slot in run.slots():
        grad = grads.get(slot.hook)
        receiver = g.receivers[slot.cols[0]]
        if grad is None or g.receiver_stage(receiver) <= after_stage:
            continue
        if slot.heads and slot.broadcast:
            grad = grad.sum(2)
        per_head = slot.heads and not slot.broadcast
        grad = token_rows(run, grad if per_head else grad.unsqueeze(2))
        out.append((g.n_senders_before(receiver), slot.cols if per_head else slot.cols[:1],
                    grad))
    return out


def _from_slot_deltas(run: GraphRun, grads: dict[str, Tensor],
                      deltas: dict[str, Tensor]) -> Float[Tensor, "sender receiver"]:
    """:func:`from_grads` with each slot's own senders' deltas (``keep_writes``)."""
    g = run.graph
    out = torch.zeros(len(g.senders), len(g.receivers), dtype=torch.float64)
    for slot in run.slots():
        grad = grads.get(slot.hook)
        if grad is None:
            continue
        n_s = g.n_senders_before(g.receivers[slot.cols[0]])
        d = deltas[slot.hook].double()
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
    and every attention pattern the QK fix reads: one forward, one backward (a plain one,
    :mod:`mechsink.discover.plain_grads`, where its premises hold; graph mode otherwise)."""
    g = run.graph
    layers = list(range(g.n_layers)) + ([g.point.layer] if g.point.kind == "attn" else [])
    plain = plain_grads.receiver_grads(run, [0.0], layers) if plain_grads.ENABLED else None
    if plain is not None:
        return plain
    coeffs = torch.zeros(1, len(g.senders), len(g.receivers))
    return run.run_coeffs(coeffs, with_grad=True, pattern_layers=layers)[1]


def result(run: GraphRun, values: Tensor, method: str, settings: dict[str, Any], *,
           scored: Sequence[int] | None = None) -> EdgeScores:
    """:class:`EdgeScores` of ``values`` with the run's settings (corruption, positions).
    Every scored edge (``scored``, default all) must have a finite score: a clear error
    otherwise (non-finite weights or activations), never NaN scores."""
    check_finite(run.graph, values, scored, true_dtype(run.model))
    settings = {**settings, "ablation": None if run.ablation is None else str(run.ablation),
                "positions": run.positions.nonzero().flatten().tolist(),
                "batch": run.batch, "seq_len": run.seq_len}
    return EdgeScores(run.graph, values, method, run.metric.name, run.clean_value,
                      run.corrupted_value, settings)


def check_finite(graph: Graph, values: Tensor, scored: Sequence[int] | None = None,
                 dtype: torch.dtype | None = None) -> None:
    """Refuse edge scores that are not finite (among ``scored``), naming how many and the
    first: the model's activations or gradients (in ``dtype``) were not finite somewhere."""
    idx = torch.arange(values.numel()) if scored is None else torch.as_tensor(
        list(scored), dtype=torch.long)
    bad = idx[~torch.isfinite(values[idx])]
    if bad.numel():
        raise BadInputError(
            f"{bad.numel()} of {idx.numel()} edge scores are not finite (first: "
            f"{graph.edge_names[int(bad[0])]} = {float(values[bad[0]])}): the model's "
            "activations or gradients are not finite there; check its weights for inf/NaN."
            + overflow_advice(dtype))


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
        check_finite(run.graph, out.values, dtype=true_dtype(run.model))
    if verify:
        top = out.order()[:verify].tolist()
        exact = run.exact(top) - run.clean_value
        first = out.values if out.first_order is None else out.first_order
        out.checks = [{"edge": run.graph.edge_names[e], "score": float(out.values[e]),
                       "first_order": float(first[e]), "exact": float(x)}
                      for e, x in zip(top, exact.tolist(), strict=True)]
        distrust(out, top, exact)
    return out


#: the least Spearman correlation of a method's top edges with their exact re-patch that
#: is trusted (below it the scores warn and the re-patched edges keep their exact scores)
AGREEMENT_BOUND = 0.5
#: re-patched edges needed before the correlation is judged
MIN_CHECKS = 5


class UntrustedScoresWarning(MechsinkWarning):
    """The exact re-patch of a method's top edges disagrees with its scores (Spearman below
    :data:`AGREEMENT_BOUND`): the ranking is not to be trusted beyond the checked edges."""


def distrust(out: EdgeScores, top: list[int], exact: Tensor) -> None:
    """Warn when the re-check of ``top`` disagrees beyond the bound, and then rank those
    edges by their exact scores (``settings["exact_where_checked"]``; the estimates stay in
    ``checks``), so a circuit selected from ``out`` uses the exact values where they exist."""
    if len(top) < MIN_CHECKS:
        return
    rho = correlation(out.values[top], exact, "spearman")
    if not rho < AGREEMENT_BOUND:  # NaN (constant values): nothing to judge
        return
    out.values = out.values.clone()
    out.values[torch.as_tensor(top)] = exact.to(out.values.dtype)
    out.settings["exact_where_checked"] = True
    other = [] if out.method != "eap-ig" else ["more steps"]
    if out.settings.get("ig", "activations") != "activations" or out.method == "eap":
        other.append("method='eap-ig' with ig='activations'")
    remedy = ", ".join([*other, "method='exact' on a shortlist"])
    warnings.warn(UntrustedScoresWarning(
        f"{out.method}'s top {len(top)} edges agree poorly with their exact re-patch "
        f"(Spearman {rho:.2f} < {AGREEMENT_BOUND}): those edges now carry their exact scores "
        f"and the circuit is selected from them; try {remedy}."), stacklevel=3)
