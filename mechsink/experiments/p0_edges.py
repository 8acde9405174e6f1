"""The P0-sink circuit as an edge graph (Peng, Li et al. 2026, "How Attention Sinks Emerge in
Large Language Models: An Interpretability Perspective"), found by edge attribution.

The question is p0_sink's: which early components' *position-0* outputs build the massive
channel at position 0? Here every edge of the graph up to the super neuron's block is scored
(EAP-IG by default: Hanna et al. 2024; with AtP*'s QK fix, Kramar et al. 2024), each
sender's write at position 0 replaced by its mean over the later positions of the same
sequence (``position_mean``, what an ordinary position writes). Then:

1. the top edges, and the top ``verify`` re-patched exactly (how far first order was, and what
   the QK fix changed);
2. the circuit: the fewest top edges whose faithfulness (every other edge corrupted) reaches
   ``target``;
3. faithfulness curves per ablation type (position_mean and zero at position 0) with a
   random-circuit baseline and AUC, next to the curve of the greedy *node* circuit
   (:mod:`mechsink.discover.node_search`: components added by single-ablation effect, each node set
   turned into the edges among its members), so the two methods are compared on one axis.

By default (``neurons="super"``) the census's complete super-neuron sets (Yu et al. 2024, "The
Super Weight in Large Language Models", made complete: :mod:`mechsink.discover.super_nodes`) in
the blocks up to the metric's are graph nodes of their own (``L3N1229``, their MLP the rest of
its write), so the circuit can name super neurons; where the census finds none, the graph has
none. ``neurons="none"``: MLPs as whole nodes; ``"L3:1229,1487"``: those neurons.

:func:`edge_part` does all of it for given tokens and super neuron, so the p0_sink experiment
can add it to its own result.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mechsink.discover import (
    GraphRun,
    curve,
    faithfulness,
    node_circuit_edges,
    score_edges,
    sets_curve,
    top_n,
)
from mechsink.discover.graph import metric_point, parse_neurons
from mechsink.discover.node_search import minimal_circuit, single_effects
from mechsink.discover.pipeline import NON_FINITE
from mechsink.discover.scores import strict_json
from mechsink.discover.super_nodes import super_neuron_nodes
from mechsink.errors import BadInputError
from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult
from mechsink.inputs.prompts import make_prompts
from mechsink.interventions.readout import dominant_super_neuron
from mechsink.patching import MassiveValue

FIGURE = "p0_edges.png"
SCHEMA = "mechsink-p0-edges/1"


def node_circuit(run: GraphRun) -> tuple[list[str], list[list[int]]]:
    """The greedy node circuit (:func:`mechsink.discover.node_search.minimal_circuit` on the edge
    graph: a component is ablated by corrupting every edge out of it) and the edge sets of its
    members added one at a time."""
    g = run.graph
    components = [s.name for s in g.senders if s.kind != "embed"]
    sign = 1.0 if run.clean_value >= 0 else -1.0
    cache: dict[frozenset, float] = {}

    def evaluate(ablated: frozenset) -> float:
        if ablated not in cache:
            keep = torch.tensor([g.senders[int(s)].name not in ablated for s in g.src])
            cache[ablated] = sign * float(run.mask_values(keep.unsqueeze(0))[0])
        return cache[ablated]

    # every single ablation in stacked forwards (what single_effects would ask one at a time)
    keeps = torch.stack([torch.tensor([g.senders[int(s)].name != c for s in g.src])
                         for c in components])
    for c, v in zip(components, run.mask_values(keeps).tolist(), strict=True):
        cache[frozenset([c])] = sign * v
    effects = single_effects(components, evaluate)
    found = minimal_circuit(components, evaluate, effects=effects)
    members = [str(m) for m in found.members]
    sets = [node_circuit_edges(g, members[:i + 1]) for i in range(len(members))]
    return members, sets


def edge_part(
    model: Any, tokens: torch.Tensor, *, channel: int, layer: int, method: str = "eap-ig",
    steps: int = 5, qk_fix: bool = True, verify: int = 20, target: float = 0.9,
    ablations: Sequence[str] = ("position_mean", "zero"), n_random: int = 3, top: int = 40,
    neurons: Mapping[int, Sequence[int]] | str | None = "super",
) -> dict[str, Any]:
    """The edge circuit of the massive ``channel`` at position 0 after block ``layer``;
    ``neurons`` (layer -> indices, ``"super"`` or None) as in
    :class:`~mechsink.discover.graph_run.GraphRun`, the super-neuron sets found once for every
    ablation's graph."""
    metric = MassiveValue(layer, 0, channel)
    if neurons == "super":
        neurons = super_neuron_nodes(model, tokens, metric_point(model, metric))
    runs = {a: GraphRun(model, tokens, metric, ablation=a, positions=[0], prepend_bos=False,
                        neurons=neurons) for a in ablations}
    run = runs[ablations[0]]
    kw: dict[str, Any] = {} if method == "exact" else {"qk_fix": qk_fix, "verify": verify}
    if method == "eap-ig":
        kw["steps"] = steps
    scores = score_edges(run, method, **kw)
    order = scores.order().tolist()
    qk: dict[str, Any] = {}
    if qk_fix and scores.first_order is not None:
        first = torch.argsort(scores.first_order.abs(), descending=True, stable=True)
        k = min(20, len(order))
        qk = {"k": k, "top_k_overlap": len(set(order[:k]) & set(first[:k].tolist())),
              "edges_rescored": int((scores.values != scores.first_order).sum()),
              "largest_changes": sorted(
                  ({"edge": run.graph.edge_names[e], "first_order": float(scores.first_order[e]),
                    "fixed": float(scores.values[e])} for e in range(run.graph.n_edges)),
                  key=lambda r: -abs(r["fixed"] - r["first_order"]))[:8]}
    members, node_sets = node_circuit(run)
    full = list(range(run.graph.n_edges))
    curves = []
    for r in runs.values():
        curves.append(curve(r, order, label=f"edges ({method})", n_random=n_random).to_dict())
        curves.append(sets_curve(r, [[]] + node_sets + [full], label="greedy node circuit",
                                 n_random=n_random).to_dict())
    reached = next((s for s, v in zip(curves[0]["sizes"], curves[0]["values"], strict=True)
                    if v >= target), run.graph.n_edges)
    circuit = top_n(scores, reached)
    circuit.faithfulness = float(faithfulness(run, circuit.mask().unsqueeze(0))[0])
    data = scores.to_dict(top=top)
    g = run.graph
    neuron_names = [s.name for s in g.senders if s.kind == "neuron"]
    in_circuit = [n for n in circuit.nodes() if n in set(neuron_names)]
    return {"neurons": {"nodes": neuron_names, "in_circuit": in_circuit,
                        "in_node_circuit": [m for m in members if m in set(neuron_names)]},
            "metric": f"massive channel {channel} at position 0 after block {layer}",
            "method": method, "settings": data["settings"], "graph": data["graph"],
            "clean_value": scores.clean_value,
            "everything_ablated": {a: r.empty_value for a, r in runs.items()},
            "top_edges": data["edges"], "checks": data["checks"],
            "check_summary": data["check_summary"], "qk_fix": qk,
            "circuit": circuit.to_dict(), "node_circuit": members,
            "node_circuit_edges": len(node_sets[-1]) if node_sets else 0, "curves": curves}


def run(model: Any, *, model_name: str | None = None, n: int = 4, seq_len: int = 16,
        method: str = "eap-ig", steps: int = 5, verify: int = 20, n_random: int = 3,
        target: float = 0.9, neurons: str = "super") -> ExperimentResult:
    """The P0-sink edge circuit on ``n`` natural sequences of ``seq_len`` tokens (with BOS).
    ``neurons``: ``"super"`` (the census's super-neuron sets as nodes, see the module doc),
    ``"none"`` or ``"L3:1229,1487"`` (``;`` between layers)."""
    check_experiment_settings("p0_edges", locals())  # before any work, as the CLI does
    wanted = neuron_setting(neurons)
    tokens = make_prompts(model, "natural", "bos", n=n, seq_len=seq_len).tokens
    sn = dominant_super_neuron(model, tokens)
    part = edge_part(model, tokens, channel=sn.channel, layer=sn.layer, method=method,
                     steps=steps, verify=verify, n_random=n_random, target=target,
                     neurons=wanted)
    data = {"schema": SCHEMA, "model": model_name or model.cfg.model_name, "n": n,
            "seq_len": seq_len,
            "super_neuron": {k: getattr(sn, k) for k in ("layer", "neuron", "channel")}, **part}
    data, paths = strict_json(data, NON_FINITE)  # JSON has no NaN: null, and where and why
    if paths:
        data["non_finite"] = {"paths": paths, "reason": NON_FINITE}
    return ExperimentResult("p0_edges", data)


def neuron_setting(neurons: Any) -> dict[int, list[int]] | str | None:
    """The ``neurons`` setting as :class:`~mechsink.discover.graph_run.GraphRun` takes it (a bad
    one is a one-line error before any work)."""
    if not isinstance(neurons, str):
        raise BadInputError(f"p0_edges --neurons must be 'super', 'none' or 'L<layer>:<n>,<n>', "
                            f"got {neurons!r}.")
    if neurons.strip() == "none":
        return None
    return parse_neurons(neurons)


def summary(data: dict[str, Any]) -> str:
    """Markdown: the graph, the top edges, the checks and QK fix, the circuits and curves."""
    g, sn = data["graph"], data["super_neuron"]
    lines = [f"# P0-sink edge circuit: {data['model']}", "",
             f"- input: {data['n']} natural sequences of {data['seq_len']} tokens with BOS",
             f"- metric: {data['metric']} (super neuron L{sn['layer']}N{sn['neuron']}); clean "
             f"{data['clean_value']:.4g}",
             f"- graph: {g['n_edges']} edges, {len(g['senders'])} senders; scores: "
             f"{data['method']} {data['settings']}", "",
             "| edge | score | first order |", "|---|---|---|"]
    for e in data["top_edges"][:12]:
        first = e.get("first_order", e["score"])
        lines.append(f"| {e['edge']} | {_f(e['score'], '.4g')} | {_f(first, '.4g')} |")
    cs = data["check_summary"]
    if cs:
        lines += ["", f"Top {cs['k']} re-patched exactly: Spearman "
                  f"{_f(cs['score']['spearman'])}"
                  f" (first order {_f(cs['first_order']['spearman'])}), max |error| "
                  f"{cs['score']['max_abs_error']:.3g} (first order "
                  f"{cs['first_order']['max_abs_error']:.3g})."]
    qk = data.get("qk_fix") or {}
    if qk:
        lines += [f"QK fix: {qk['edges_rescored']} edges rescored; top-{qk['k']} overlap with "
                  f"first order {qk['top_k_overlap']}/{qk['k']}."]
    c = data["circuit"]
    nn = data.get("neurons") or {}
    if nn.get("nodes"):
        lines += ["", f"Neuron nodes: {', '.join(nn['nodes'])}; in the edge circuit: "
                  f"{', '.join(nn['in_circuit']) or 'none'}; in the node circuit: "
                  f"{', '.join(nn['in_node_circuit']) or 'none'}."]
    lines += ["", f"Edge circuit: {c['n_edges']} of {g['n_edges']} edges, faithfulness "
              f"{_f(c['faithfulness'])} (criterion: the fewest top edges reaching the target "
              "on the position_mean curve).",
              f"Greedy node circuit: {', '.join(data['node_circuit']) or '(empty)'} = "
              f"{data['node_circuit_edges']} edges.", "",
              "| curve | ablation | AUC | random AUC |", "|---|---|---|---|"]
    for cv in data["curves"]:
        lines.append(f"| {cv['label']} | {cv['ablation']} | {_f(cv['auc'])} | "
                     f"{_f(cv['random_auc'])} |")
    return "\n".join(lines) + "\n"


def _f(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def figure(data: dict[str, Any], path: Path) -> Path:
    """Faithfulness curves (edge and node circuits, per ablation) into ``path``; the edge
    circuit beside it as ``<name>_circuit.png``."""
    from mechsink.viz.discover import draw_circuit, draw_curves

    out = draw_curves(data["curves"], path, title=f"P0-sink circuit, {data['model']}")
    draw_circuit(data["circuit"], Path(path).with_name(Path(path).stem + "_circuit.png"),
                 title=f"P0-sink edge circuit, {data['model']}")
    return out


__all__ = ["FIGURE", "SCHEMA", "edge_part", "figure", "neuron_setting", "node_circuit", "run",
           "summary"]
