"""Discovery end to end: score every edge, pick a circuit, draw its faithfulness curves per
ablation, save JSON and figures. What ``mechsink discover`` and the p0_edges experiment call.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save
from torch import Tensor

from mechsink.discover.circuit import (
    Circuit,
    faithfulness,
    gap,
    gap_note,
    greedy,
    read_json,
    top_n,
)
from mechsink.discover.curves import Curve, curve, default_sizes
from mechsink.discover.graph import Graph
from mechsink.discover.graph_run import GraphRun
from mechsink.discover.methods import check_options, declared_options, score_edges
from mechsink.discover.scores import EdgeScores, fmt, strict_json
from mechsink.errors import BadInputError
from mechsink.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from mechsink.names import explicit_bos
from mechsink.patching.engine import TokensLike
from mechsink.patching.metrics import Metric

SCHEMA = "mechsink-discover/1"
#: every edge's score (and first-order score), beside discover.json's top 500
SCORES_FILE = "scores.safetensors"
NON_FINITE = ("undefined: faithfulness where m(clean) equals m(every edge corrupted), or a "
              "correlation of fewer than two or constant values")


@dataclass
class Discovery:
    """Scores, the chosen circuit and the faithfulness curves of one discovery run."""

    scores: EdgeScores
    circuit: Circuit
    curves: list[Curve] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self, *, top: int = 500) -> dict[str, Any]:
        """JSON-ready and strict: a number that is not finite (a faithfulness whose clean and
        empty values coincide, a correlation of constant values) is ``null``, and
        ``non_finite`` lists where and why."""
        data, paths = strict_json(
            {"schema": SCHEMA, **self.meta, "scores": self.scores.to_dict(top=top),
             "circuit": self.circuit.to_dict(), "curves": [c.to_dict() for c in self.curves]},
            NON_FINITE)
        if paths:
            data["non_finite"] = {"paths": paths, "reason": NON_FINITE}
        return data

    def summary(self) -> str:
        return summary(self.to_dict(top=20))

    def save(self, out: str | Path) -> Path:
        """``discover.json`` (top 500 edges, circuit, curves), ``circuit.json``,
        ``scores.safetensors`` (every edge's score, so :meth:`load` gets them all back) and
        ``summary.md`` into ``out``; :func:`mechsink.viz.discover.draw_discovery` draws the
        figures from them."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        data = self.to_dict()
        atomic_write_json(out / "discover.json", data)
        self.circuit.save(out / "circuit.json")
        tensors = {"values": self.scores.values.detach().to("cpu", torch.float64).contiguous()}
        if self.scores.first_order is not None:
            tensors["first_order"] = self.scores.first_order.detach().to(
                "cpu", torch.float64).contiguous()
        atomic_write_bytes(out / SCORES_FILE, safetensors_save(tensors))
        atomic_write_text(out / "summary.md", summary(data))
        return out

    @classmethod
    def load(cls, folder: str | Path) -> Discovery:
        """A discovery :meth:`save` wrote (``mechsink discover --out``), without the model:
        the graph, every edge's score (from ``scores.safetensors``; a folder without it gives
        the 500 edges ``discover.json`` lists, the rest NaN), the circuit and the curves."""
        folder = Path(folder)
        data = read_json(folder / "discover.json")
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise BadInputError(f"{folder / 'discover.json'} is not a mechsink discovery "
                                f"(schema {SCHEMA!r}).")
        graph = Graph.from_dict(data["scores"]["graph"])
        full: dict[str, Tensor] = {}
        if (folder / SCORES_FILE).is_file():
            try:
                full = safetensors_load((folder / SCORES_FILE).read_bytes())
            except Exception as exc:  # safetensors raises its own error types
                raise BadInputError(f"cannot read {folder / SCORES_FILE}: {exc}.") from None
        scores = EdgeScores.from_dict(data["scores"], graph, values=full.get("values"),
                                      first_order=full.get("first_order"))
        circuit = Circuit.from_dict(data["circuit"], graph, scores=scores.values)
        curves = [Curve.from_dict(c) for c in data.get("curves", [])]
        meta = {k: v for k, v in data.items()
                if k not in ("schema", "scores", "circuit", "curves", "non_finite")}
        return cls(scores, circuit, curves, meta)


def discover(
    model: Any,
    clean: TokensLike,
    metric: Metric | Callable[[Tensor], Tensor],
    *,
    corrupted: TokensLike | None = None,
    ablation: str | None = None,
    positions: Sequence[int] | None = None,
    method: str = "eap-ig",
    select: str = "top",
    n_edges: int | None = None,
    target: float = 0.9,
    curve_ablations: Sequence[str] = (),
    n_random: int = 3,
    prepend_bos: bool | None = None,
    seed: int = 0,
    neurons: Mapping[int, Sequence[int]] | str | None = None,
    memory_budget: int | str | None = None,
    max_exact: int = 1000,
    **method_options: Any,
) -> Discovery:
    """Score every edge with ``method`` (a name in :data:`mechsink.discover.methods.METHODS`)
    and ``method_options``, the options the methods declare (e.g. ``steps``, ``ig``,
    ``qk_fix``, ``verify``, ``convention``; the method gets those it takes, the declared
    default for the others, and an option only another method takes is checked and left out;
    :func:`~mechsink.discover.methods.check_options`), select a circuit
    (``select="top"``: the ``n_edges`` best, default the smallest measured size reaching
    ``target``; ``"greedy"``), and draw its faithfulness curve under the scoring corruption
    and each of ``curve_ablations``. ``seed``: the resample ablation's and the random
    baselines' seed. ``neurons`` (layer -> indices, e.g. ``{11: [1229, 1487]}``): those MLP
    neurons are graph nodes of their own (:class:`~mechsink.discover.graph_run.GraphRun`;
    ``"super"``: the census's complete super-neuron sets). ``convention="reference"``: EAP-IG's
    step points and sums as the reference implementation computes them
    (:func:`~mechsink.discover.methods.eap_ig.eap_ig`), to reproduce published numbers.
    ``memory_budget``: bytes (or ``"2GiB"``) the
    run's tensors may hold (default: a share of what the device has free; a run that cannot
    fit is refused before any forward, :mod:`mechsink.discover.memory`). When the exact
    re-check of the top edges disagrees with the method (the scores are untrusted), the edges
    of the selected circuit are patched exactly and the circuit selected again until it rests
    on exact scores alone, up to ``max_exact`` exact edges (:func:`rest_on_exact`)."""
    if select not in ("top", "greedy"):
        raise BadInputError(f"select must be 'top' or 'greedy', got {select!r}.")
    options = check_options(method, method_options)  # before any forward
    check_selection(n_edges, target)
    prepend_bos = explicit_bos(prepend_bos, clean, corrupted, where="discover")
    run = GraphRun(model, clean, metric, corrupted=corrupted, ablation=ablation,
                   positions=positions, prepend_bos=prepend_bos, seed=seed, neurons=neurons,
                   memory_budget=memory_budget)
    check_selection(n_edges, target, run.graph.n_edges)  # before any scoring
    scores = score_edges(run, method, **options)
    order = scores.order().tolist()
    curves = [curve(run, order, label=method, n_random=n_random, seed=seed)]
    if select == "greedy":
        circuit = greedy(run, scores, target=target, max_edges=n_edges)
    else:
        if n_edges is None:
            reached = curves[0].size_reaching(target)
            n_edges = reached if reached is not None else run.graph.n_edges
        circuit = top_n(scores, n_edges)
        if scores.settings.get("exact_where_checked"):  # the re-check disagreed: widen it
            circuit, scores.settings["exact_selection"] = rest_on_exact(run, scores, n_edges,
                                                                        max_exact)
        circuit.faithfulness = float(faithfulness(run, circuit.mask().unsqueeze(0))[0])
    for abl in curve_ablations:
        other = GraphRun(model, run.tokens, run.metric, ablation=abl,
                         positions=_positions(run, abl), prepend_bos=False, seed=seed,
                         neurons=run.graph.neurons, memory_budget=run.memory_budget)
        curves.append(curve(other, order, label=method, n_random=n_random, seed=seed))
    meta = {"metric": scores.metric, "method": method, "corruption": scores.settings.get(
        "ablation") or "counterfactual", "n_edges_total": run.graph.n_edges,
        "faithfulness_gap": gap(run)}
    return Discovery(scores, circuit, curves, meta)


def _with_method_options(fn: Callable[..., Any]) -> inspect.Signature:
    """``fn``'s signature with every registered method's options as keywords of their own,
    with the declared defaults (what ``help()`` and ``inspect.signature`` show), before its
    ``**method_options``."""
    sig = inspect.signature(fn)
    params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    declared = [inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default,
                                  annotation=o.type.__name__)
                for o in declared_options().values()]
    return sig.replace(parameters=[*params, *declared, *(p for p in sig.parameters.values()
                                                         if p.kind is p.VAR_KEYWORD)])


discover.__signature__ = _with_method_options(discover)  # type: ignore[attr-defined]


def rest_on_exact(run: GraphRun, scores: EdgeScores, n: int, max_exact: int
                  ) -> tuple[Circuit, dict[str, Any]]:
    """The top ``n`` edges selected from scores that are exact wherever the circuit is: each
    round patches exactly the circuit's edges that only have an estimate, puts their exact
    scores in ``scores`` and selects again, until every edge of the circuit is exact or
    ``max_exact`` edges would be exceeded (then the circuit is said to rest partly on
    estimates). Returns the circuit and what was done."""
    if isinstance(max_exact, bool) or not isinstance(max_exact, int) or max_exact < 0:
        raise BadInputError(f"max_exact must be a non-negative integer, got {max_exact!r}.")
    checked = {run.graph.edge_index(c["edge"]) for c in scores.checks}
    rounds = 0
    while True:
        circuit = top_n(scores, n)
        missing = [e for e in circuit.edges if e not in checked]
        if not missing or len(checked) + len(missing) > max_exact:
            break
        exact = run.exact(missing) - run.clean_value
        scores.values = scores.values.clone()
        scores.values[torch.as_tensor(missing)] = exact.to(scores.values.dtype)
        checked.update(missing)
        rounds += 1
    return circuit, {"exact_edges": len(checked), "rounds": rounds,
                     "rests_on_exact": not missing, "estimated_in_circuit": len(missing),
                     "max_exact": max_exact}


def check_selection(n_edges: Any, target: Any, n_total: int | None = None) -> None:
    """The circuit's size ``n_edges`` (``--edges``; None or an integer in 0..``n_total``, the
    graph's edge count once known) and ``target`` (``--target``: a faithfulness in (0, 1]),
    checked before any scoring; the messages name both spellings."""
    if (isinstance(target, bool) or not isinstance(target, (int, float))
            or not math.isfinite(target) or not 0 < target <= 1):
        raise BadInputError(f"target (--target) must be a faithfulness in (0, 1], got "
                            f"{target!r}.")
    if n_edges is None:
        return
    top = "" if n_total is None else f"..{n_total} (the graph's edges)"
    if (isinstance(n_edges, bool) or not isinstance(n_edges, int) or n_edges < 0
            or (n_total is not None and n_edges > n_total)):
        raise BadInputError(f"n_edges (--edges) must be an integer in 0{top or ' or more'}, "
                            f"got {n_edges!r}.")


def _positions(run: GraphRun, ablation: str) -> list[int] | None:
    """The scoring run's positions (all of them stay all, except for position_mean)."""
    pos = run.positions.nonzero().flatten().tolist()
    if len(pos) == run.seq_len:
        if ablation == "position_mean":
            raise BadInputError("a position_mean curve needs the scoring run to corrupt some "
                                "positions only (positions=[...]).")
        return None
    return pos


def summary(data: dict[str, Any]) -> str:
    """Markdown: the settings, the top edges, the checks, the circuit and the curves."""
    s = data["scores"]
    lines = [f"# Edge discovery: {data.get('method')} on {data.get('metric')}", "",
             f"- graph: {s['graph']['n_edges']} edges, metric read at "
             f"{s['graph']['metric_point']['kind']} {s['graph']['metric_point']['layer']}",
             f"- corruption: {data.get('corruption')}; clean {s['clean_value']:.4g}, "
             f"settings {s['settings']}", "",
             "| edge | score |" + (" first order |" if s["edges"] and "first_order" in
                                    s["edges"][0] else ""),
             "|---|---|" + ("---|" if s["edges"] and "first_order" in s["edges"][0] else "")]
    for e in s["edges"][:15]:
        fo = f" {fmt(e['first_order'], '.4g')} |" if "first_order" in e else ""
        lines.append(f"| {e['edge']} | {fmt(e['score'], '.4g')} |{fo}")
    cs = s.get("check_summary") or {}
    if cs:
        lines += ["", f"Top {cs['k']} edges re-patched exactly: Spearman "
                  f"{fmt(cs['score']['spearman'])}, max |error| "
                  f"{fmt(cs['score']['max_abs_error'], '.3g')} (first order: Spearman "
                  f"{fmt(cs['first_order']['spearman'])}, max |error| "
                  f"{fmt(cs['first_order']['max_abs_error'], '.3g')})."]
    c = data["circuit"]
    lines += ["", f"Circuit: {c['n_edges']} edges ({c['how']}), faithfulness "
              f"{fmt(c.get('faithfulness'))}"]
    sel = s["settings"].get("exact_selection")
    if sel:
        lines += ["", ("The method's scores disagreed with their exact re-check, so the circuit "
                       f"was selected again from exact scores ({sel['exact_edges']} edges "
                       f"patched exactly, {sel['rounds']} rounds): " +
                       ("every edge of the circuit rests on its exact score." if
                        sel["rests_on_exact"] else
                        f"{sel['estimated_in_circuit']} of its edges still carry estimates "
                        f"(more than max_exact = {sel['max_exact']} exact edges would be "
                        "needed)."))]
    note = gap_note(data.get("faithfulness_gap") or {})
    if note:
        lines += ["", f"**Note:** {note}"]
    lines += [
              "", "| curve | ablation | AUC | random AUC |", "|---|---|---|---|"]
    for cv in data["curves"]:
        lines.append(f"| {cv['label']} | {cv['ablation']} | {fmt(cv['auc'])} | "
                     f"{fmt(cv['random_auc'])} |")
    return "\n".join(lines) + "\n"


__all__ = ["Discovery", "check_selection", "default_sizes", "discover", "summary"]
