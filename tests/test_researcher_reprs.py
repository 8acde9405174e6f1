"""Reprs a line long with a key number, and Jupyter cards (#30 item 5)."""

from __future__ import annotations

import html

import torch

from mechsink.discover import EdgeScores, Graph
from mechsink.interventions.readout import MassiveChannelSets
from mechsink.measure.massive import massive_activations
from mechsink.measure.sinks import sink_scores
from mechsink.measure.super_neurons import SuperNeuronSet
from mechsink.patching import LogitDiff


def _short(obj, *must):
    text = repr(obj)
    assert "\n" not in text and len(text) < 240 and "tensor(" not in text, text
    for m in must:
        assert m in text, (m, text)
    return text


def test_sink_scores_and_massive_report_reprs(llama_tiny):
    tokens = torch.randint(0, 1000, (3, 8), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = llama_tiny.run_with_cache(tokens)
    sinks = sink_scores(cache)
    layer, head, score = sinks.top_heads(1)[0]
    _short(sinks, "3 sequences x 2 layers x 4 heads", f"L{layer}H{head} ({score:.3f})",
           f"rate={sinks.rate:.3f}")
    assert "<table" in sinks._repr_html_() and f"L{layer}H{head}" in sinks._repr_html_()
    report = massive_activations(cache)
    n = len(report.activations("position"))
    _short(report, "3 sequences x 2 layers", f"{n} (token median)", "(layer median)")
    assert report._repr_html_().count("<table") == 2


def test_edge_scores_repr(gpt2_tiny):
    graph = Graph.build(gpt2_tiny, LogitDiff(11, 12))
    values = torch.linspace(-1, 2, graph.n_edges, dtype=torch.float64)
    scores = EdgeScores(graph, values, "eap", "logit_diff", 1.5, -0.25)
    text = _short(scores, "method='eap'", f"edges={graph.n_edges}", "clean=1.5",
                  "corrupted=-0.25", "(+2)")
    assert repr(graph.edge_names[-1]) in text
    card = scores._repr_html_()
    assert card.count("<tr>") == 11 and html.escape(graph.edge_names[-1]) in card


def test_super_neuron_set_and_channel_sets_reprs():
    neurons = tuple((n, 10.0 - n) for n in range(8))
    s = SuperNeuronSet(3, 507, 1234.5, 1200.0, neurons, 0.96, 0.9, 0.95, True)
    _short(s, "layer=3", "channel=507", "8 neurons [0, 1, 2, 3, 4, ...]", "explained=0.960")
    sets = MassiveChannelSets(507, 3, 5, [0.0] * 30, [1.0] * 30, {3: s}, [3], [507])
    _short(sets, "channel=507", "creating_layer=3", "sets=1 (layers [3])")
    assert "<table" in sets._repr_html_() and "<td>1234" in sets._repr_html_()
