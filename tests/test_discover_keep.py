"""A saved discovery reloads without the model (graph, every score, circuit, curves) and
exports as an edge list from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mechsink.app.cli import app
from mechsink.discover import (
    Circuit,
    Discovery,
    Graph,
    discover,
    load_edge_list,
    save_edge_list,
    top_n,
)
from mechsink.errors import BadInputError
from mechsink.inputs.prompts import make_prompts
from mechsink.patching import LogitDiff, MassiveValue, SinkScore


@pytest.mark.parametrize("which, metric, neurons", [
    ("gpt2_tiny", LogitDiff(11, 12), None),
    ("llama_tiny", SinkScore(1), None),
    ("llama_tiny", MassiveValue(1, 0, 3), {0: [3, 7]}),
])
def test_graph_rebuilds_from_its_dict_without_the_model(request, which, metric, neurons):
    model = request.getfixturevalue(which)
    graph = Graph.build(model, metric, neurons)
    back = Graph.from_dict(json.loads(json.dumps(graph.to_dict())))
    assert back.edge_names == graph.edge_names and back.neurons == graph.neurons
    assert back.senders == graph.senders and back.receivers == graph.receivers
    assert torch.equal(back.valid, graph.valid)


def test_a_foreign_graph_is_refused(gpt2_tiny):
    data = Graph.build(gpt2_tiny, LogitDiff(11, 12)).to_dict()
    with pytest.raises(BadInputError, match="not a mechsink graph"):
        Graph.from_dict({**data, "receivers": data["receivers"][:-1]})
    with pytest.raises(BadInputError, match="not a mechsink graph"):
        Graph.from_dict({k: v for k, v in data.items() if k != "n_heads"})


def test_saved_discovery_reloads_with_every_score(llama_tiny, tmp_path: Path):
    tokens = make_prompts(llama_tiny, "natural", "bos", n=2, seq_len=6).tokens
    found = discover(llama_tiny, tokens, MassiveValue(1, 0, 3), method="eap", verify=3,
                     ablation="position_mean", positions=[0])
    found.save(tmp_path)
    back = Discovery.load(tmp_path)
    assert back.scores.graph.edge_names == found.scores.graph.edge_names
    assert torch.equal(back.scores.values, found.scores.values.double())
    assert back.scores.checks == json.loads(json.dumps(found.scores.checks))
    assert back.scores.method == found.scores.method and back.meta["method"] == "eap"
    assert back.circuit.edges == found.circuit.edges
    assert back.circuit.faithfulness == pytest.approx(found.circuit.faithfulness)
    assert [c.to_dict() for c in back.curves] == json.loads(json.dumps(
        [c.to_dict() for c in found.curves]))
    # the circuit file alone, and through the edge-list reader (it carries its graph)
    alone = Circuit.load(tmp_path / "circuit.json")
    assert alone.edges == found.circuit.edges
    listed = load_edge_list(tmp_path / "circuit.json")
    assert listed.names == found.circuit.names
    assert load_edge_list(tmp_path / "circuit.json", found.scores.graph).edges == listed.edges
    # without the full-score file: the 500 listed edges (here all of them) come back
    (tmp_path / "scores.safetensors").unlink()
    partial = Discovery.load(tmp_path)
    assert torch.allclose(partial.scores.values, found.scores.values.double(), atol=1e-6)


def test_export_command_writes_edge_lists_without_the_model(tmp_path: Path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "discover", "random:llama-tiny", "--metric", "massive_value:1:0:3", "--method", "eap",
        "--n", "2", "--seq-len", "6", "--verify", "0", "--export", "tsv,json",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "edges.tsv").read_text().startswith("src\tdest\tscore\tedge\n")
    saved = Discovery.load(out)
    assert load_edge_list(out / "edges.json").names == saved.circuit.names
    # the export command: the saved circuit, or the top N by the saved scores
    result = CliRunner().invoke(app, ["export", str(out), "--to", str(tmp_path / "c.tsv")])
    assert result.exit_code == 0, result.output
    assert load_edge_list(tmp_path / "c.tsv", saved.scores.graph).names == saved.circuit.names
    result = CliRunner().invoke(app, ["export", str(out), "--to", str(tmp_path / "t.json"),
                                      "--edges", "5"])
    assert result.exit_code == 0, result.output
    mine = tmp_path / "mine.json"
    save_edge_list(top_n(saved.scores, 5), mine)
    assert json.loads((tmp_path / "t.json").read_text())["edges"] == json.loads(
        mine.read_text())["edges"]


@pytest.mark.parametrize("args, message", [
    (["discover", "random:llama-tiny", "--metric", "sink_score:1", "--export", "csv"],
     "--export takes tsv and/or json"),
    (["export", "FOLDER", "--to", "x.csv"], "must end in .tsv or .json"),
    (["export", "FOLDER", "--to", "x.tsv"], "holds no discover.json"),
])
def test_export_options_are_checked_before_any_work(tmp_path: Path, args, message):
    args = [a.replace("FOLDER", str(tmp_path)) for a in args]
    if args[0] == "discover":
        args += ["--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output
