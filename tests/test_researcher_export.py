"""Export of a discovered circuit to auto-circuit / ACDC edge lists, and back (#30 item 9)."""

from __future__ import annotations

import json

import pytest
import torch

from mechsink.discover import Circuit, Graph, load_edge_list, save_edge_list
from mechsink.errors import BadInputError
from mechsink.patching import LogitDiff, SinkScore


def _circuit(graph, names):
    edges = [graph.edge_index(n) for n in names]
    scores = torch.zeros(graph.n_edges, dtype=torch.float64)
    scores[edges] = torch.arange(1, len(edges) + 1, dtype=torch.float64) / 8
    return Circuit(graph, edges, "top_n", 0.75, scores)


@pytest.mark.parametrize("suffix", [".json", ".tsv"])
def test_round_trip_and_auto_circuit_names(gpt2_tiny, tmp_path, suffix):
    graph = Graph.build(gpt2_tiny, LogitDiff(11, 12))
    names = ["embed->L0H1.q", "L0H1->L1H0.k", "MLP0->L1H3.v", "L1H2->metric", "L0H0->MLP1"]
    circuit = _circuit(graph, names)
    path = save_edge_list(circuit, tmp_path / f"circuit{suffix}")
    back = load_edge_list(path, graph)
    assert back.edges == circuit.edges
    assert torch.equal(back.scores, circuit.scores)
    text = path.read_text()
    # auto-circuit's node names, written out by hand
    for src, dest in [("Resid Start", "A0.1.Q"), ("A0.1", "A1.0.K"), ("MLP 0", "A1.3.V"),
                      ("A1.2", "Resid End"), ("A0.0", "MLP 1")]:
        assert (f"{src}\t{dest}\t" if suffix == ".tsv" else f'"src": "{src}"') in text
    if suffix == ".json":
        data = json.loads(text)
        assert data["schema"] == "mechsink-edge-list/1" and back.faithfulness == 0.75
        assert data["edges"][1]["acdc"] == ["blocks.1.hook_k_input", 0,
                                            "blocks.0.attn.hook_result", 1]
        assert data["edges"][0]["acdc"] == ["blocks.0.hook_q_input", 1,
                                            "blocks.0.hook_resid_pre", None]
        assert data["edges"][3]["acdc"][0] == "blocks.1.hook_resid_post"


def test_hand_written_auto_circuit_list_on_a_grouped_query_model(llama_tiny, tmp_path):
    """Another tool's list (auto-circuit names only) reads in; GQA keys are KV heads; a sink
    metric reading layer 1's attention input is 'Resid Mid 1'."""
    graph = Graph.build(llama_tiny, LogitDiff(11, 12))
    path = tmp_path / "theirs.tsv"
    path.write_text("src\tdest\tscore\nA0.3\tA1.KV1.K\t0.5\nResid Start\tResid End\t\n")
    circuit = load_edge_list(path, graph)
    assert circuit.names == ["L0H3->L1KV1.k", "embed->metric"]
    assert float(circuit.scores[circuit.edges[0]]) == 0.5
    sink_graph = Graph.build(llama_tiny, SinkScore(1))
    path.write_text("src\tdest\nA0.2\tResid Mid 1\n")
    assert load_edge_list(path, sink_graph).names == ["L0H2->metric"]
    path.write_text("src\tdest\tscore\nA0.3\tA1.7.K\t0.5\n")
    graph = Graph.build(llama_tiny, LogitDiff(11, 12))
    with pytest.raises(BadInputError, match="entry 0: no edge A0.3->A1.7.K"):
        load_edge_list(path, graph)
    with pytest.raises(BadInputError, match=r"must end in \.json or \.tsv"):
        save_edge_list(circuit, tmp_path / "c.csv")
    assert not (tmp_path / "c.csv").exists()
