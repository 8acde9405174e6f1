"""MLP neurons as graph nodes (#26 item 5): a neuron sender writes ``post_n * W_out[n]``, its
MLP the rest. Its exact edge patch equals path patching of the neuron (TransformerLens's own
``mlp.hook_post`` patched, everything else frozen), and its EAP score equals a gradient x delta
computed here by hand with ``run_with_hooks``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mechsink.app.cli import app
from mechsink.discover import Graph, GraphRun, eap, graph_mode, parse_neurons
from mechsink.errors import BadInputError
from mechsink.model import act_name
from mechsink.patching import LogitDiff, MassiveValue, SinkScore, path_patch

CLEAN = torch.randint(5, 500, (2, 7), generator=torch.Generator().manual_seed(0))
CORR = torch.randint(5, 500, (2, 7), generator=torch.Generator().manual_seed(1))
NEURONS = {0: [3, 17]}


def test_neuron_senders_sit_after_their_mlp(llama_tiny):
    g = Graph.build(llama_tiny, LogitDiff(11, 12), NEURONS)
    names = [s.name for s in g.senders]
    assert names[5:8] == ["MLP0", "L0N3", "L0N17"] and len(names) == 13
    plain = Graph.build(llama_tiny, LogitDiff(11, 12))
    # each neuron reads like MLP0: layer 1's 8 attention inputs, MLP1 and the metric
    assert g.n_edges == plain.n_edges + 2 * 10
    assert "L0N17->L1H2.q" in g.edge_names and g.to_dict()["neurons"] == {"0": [3, 17]}


@pytest.mark.parametrize("fixture", ["llama_tiny", "gpt2_tiny"])
def test_writes_add_up_to_the_mlp_output(request, fixture):
    model = request.getfixturevalue(fixture)
    run = GraphRun(model, CLEAN, LogitDiff(11, 12), corrupted=CORR, neurons=NEURONS)
    with torch.no_grad():
        _, cache = model.run_with_cache(CLEAN)
    g = run.graph
    cols = [i for i, s in enumerate(g.senders) if s.layer == 0 and s.kind in ("mlp", "neuron")]
    total = run.w_clean[:, :, cols].sum(2)
    torch.testing.assert_close(total, cache[act_name("mlp_out", 0)], atol=1e-5, rtol=1e-5)
    post = cache[act_name("post", 0)]
    w_out = model.W_out[0].detach()
    torch.testing.assert_close(run.w_clean[:, :, cols[2]], post[..., 17, None] * w_out[17],
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("fixture", ["llama_tiny", "gpt2_tiny"])
@pytest.mark.parametrize("case", ["logits", "massive_posmean"])
def test_neuron_edge_exact_equals_path_patch(request, fixture, case):
    model = request.getfixturevalue(fixture)
    if case == "logits":
        metric, kw, at = LogitDiff(11, 12), {"corrupted": CORR}, ""
    else:
        metric, kw, at = MassiveValue(1, 0, 3), {"ablation": "position_mean",
                                                 "positions": [0]}, "@0"
    run = GraphRun(model, CLEAN, metric, neurons=NEURONS, **kw)
    g = run.graph
    edges = [e for e in range(g.n_edges) if g.senders[int(g.src[e])].kind == "neuron"]
    assert len(edges) >= 10
    ours = run.exact(edges) - run.clean_value
    for i, e in enumerate(edges):
        s, r = g.path_spec(e)
        pp = path_patch(model, CLEAN, kw.get("corrupted"), [s + at], [r], metric,
                        ablation=kw.get("ablation"), batch_size=1)
        assert float(ours[i]) == pytest.approx(float(pp.values[0]) - pp.clean_value,
                                               abs=1e-5, rel=1e-4), g.edge_names[e]


def test_neuron_edge_eap_is_gradient_times_delta_by_hand(llama_tiny):
    model, metric = llama_tiny, LogitDiff(11, 12)
    run = GraphRun(model, CLEAN, metric, corrupted=CORR, neurons=NEURONS)
    scores = eap(run, qk_fix=False, verify=0).values
    with torch.no_grad():
        _, c = model.run_with_cache(CLEAN)
        _, x = model.run_with_cache(CORR)
    w_out = model.W_out[0].detach()
    g = run.graph
    for n in NEURONS[0]:
        delta = (x[act_name("post", 0)] - c[act_name("post", 0)])[..., n, None] * w_out[n]
        for hook, head, rname in ((act_name("attn.hook_q_input", 1), 2, "L1H2.q"),
                                  (act_name("attn.hook_v_input", 1), 1, "L1KV1.v"),
                                  (act_name("hook_mlp_in", 1), None, "MLP1")):
            kept: dict[str, torch.Tensor] = {}

            def keep(act, hook, kept=kept):
                act = act.detach().clone().requires_grad_(True)
                kept["x"] = act
                return act

            with graph_mode(model):
                logits = model.run_with_hooks(CLEAN, fwd_hooks=[(hook, keep)])
                value = (logits[:, -1, 11] - logits[:, -1, 12]).mean()
                (grad,) = torch.autograd.grad(value, [kept["x"]])
            grad = grad if head is None else grad[:, :, head]
            by_hand = float((delta.double() * grad.double()).sum())
            e = g.edge_index(f"L0N{n}->{rname}")
            assert float(scores[e]) == pytest.approx(by_hand, abs=1e-6, rel=1e-4)


def test_bad_neurons_are_refused(llama_tiny):
    for bad, msg in (({7: [1]}, "not a layer"), ({0: [10**6]}, "indices in"),
                     ({0: [1, 1]}, "repeat"), ({1: [1]}, "after the metric")):
        with pytest.raises(BadInputError, match=msg):
            Graph.build(llama_tiny, SinkScore(1) if 1 in bad else LogitDiff(11, 12), bad)
    assert parse_neurons(["L11:1229,1487", "L3:5"]) == {11: [1229, 1487], 3: [5]}
    assert parse_neurons("L2:1;L4:2,3") == {2: [1], 4: [2, 3]}
    for bad in ("11:1", "Lx:1", "L2:", "L2:1;L2:3"):
        with pytest.raises(BadInputError):
            parse_neurons(bad)


def test_cli_discover_with_neurons(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "discover", "random:llama-tiny", "--metric", "massive_value:1:0:3", "--method", "eap",
        "--n", "2", "--seq-len", "6", "--verify", "0", "--neurons", "L0:3,17",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "discover.json").read_text())
    assert "L0N17" in data["scores"]["graph"]["senders"]
    bad = CliRunner().invoke(app, ["discover", "no-such-model", "--metric", "sink_score:1",
                                   "--neurons", "11:3", "--out", str(tmp_path / "o")])
    assert bad.exit_code == 2 and "neurons" in bad.output


def test_super_neuron_sets_as_nodes(llama_tiny):
    """neurons="super": the complete sets massive_channel_sets finds, in the graph's blocks."""
    from mechsink.interventions.readout import massive_channel_sets

    found = massive_channel_sets(llama_tiny, CLEAN)
    want = {lay: sorted(n for n, _ in s.neurons) for lay, s in found.sets.items()
            if s.neurons}
    assert want  # the creating block always has its set
    run = GraphRun(llama_tiny, CLEAN, LogitDiff(11, 12), corrupted=CORR, neurons="super")
    assert run.graph.neurons == want
    names = {s.name for s in run.graph.senders if s.kind == "neuron"}
    assert names == {f"L{lay}N{n}" for lay, ns in want.items() for n in ns}
    assert parse_neurons("super") == "super"
    with pytest.raises(BadInputError, match="'super'"):
        GraphRun(llama_tiny, CLEAN, LogitDiff(11, 12), corrupted=CORR, neurons="all")


def _planted_super_neuron(neuron: int = 94, channel: int = 7):
    """random:gpt2-tiny with a super neuron planted by hand: position 0's positional embedding
    carries a marker channel (20 where other entries are ~0.02), neuron ``neuron`` of MLP 0
    reads the marker above a threshold (so it fires at position 0 only) and writes 50 per unit
    into ``channel``: a massive channel at position 0 made by one neuron."""
    from mechsink import load_model
    from mechsink.model import hf_model_of

    model = load_model("random:gpt2-tiny", device="cpu", seed=0)
    tr = hf_model_of(model).transformer
    marker = 3
    with torch.no_grad():
        tr.wpe.weight[0, marker] = 20.0
        fc, proj = tr.h[0].mlp.c_fc, tr.h[0].mlp.c_proj
        fc.weight[:, neuron] = 0.0
        fc.weight[marker, neuron] = 1.0
        fc.bias[neuron] = -3.0
        proj.weight[neuron] = 0.0
        proj.weight[neuron, channel] = 50.0
    return model


def test_p0_edges_names_the_super_neuron_in_its_circuit():
    """p0_edges's default neurons="super": the census's set is graph nodes, and the circuit of
    the massive channel at position 0 runs through the planted neuron (its position-0 write
    replaced by the later positions' mean, where it is silent, removes the channel)."""
    from mechsink.experiments import p0_edges
    from mechsink.interventions.readout import massive_channel_sets

    model = _planted_super_neuron()
    data = p0_edges.run(model, n=2, seq_len=6, steps=2, verify=3, n_random=1).data
    assert data["super_neuron"] == {"layer": 0, "neuron": 94, "channel": 7}
    tokens = torch.full((1, 6), int(model.tokenizer.bos_token_id))  # what the census sees
    found = massive_channel_sets(model, tokens)
    assert found.channel == 7 and 94 in [n for n, _ in found.sets[0].neurons]
    nodes = data["neurons"]["nodes"]
    assert "L0N94" in nodes and nodes == data["graph"]["senders"][
        data["graph"]["senders"].index("MLP0") + 1:][:len(nodes)]
    assert "L0N94" in data["neurons"]["in_circuit"]
    assert any(r["sender"] == "L0N94" for r in data["circuit"]["edges"])
    assert data["top_edges"][0]["edge"].startswith(("L0N94->", "embed->MLP0"))
    plain = p0_edges.run(model, n=2, seq_len=6, steps=2, verify=0, n_random=1,
                         neurons="none").data
    assert plain["neurons"]["nodes"] == [] and "L0N94" not in plain["graph"]["senders"]
    named = p0_edges.run(model, n=2, seq_len=6, steps=2, verify=0, n_random=1,
                         neurons="L0:94").data
    assert named["neurons"]["nodes"] == ["L0N94"]
    with pytest.raises(BadInputError, match="neurons"):
        p0_edges.run(model, n=2, seq_len=6, neurons="L0:")
