"""Edge discovery on GPT-2-tiny with weights set by hand: a planted circuit plus a decoy, and
a saturated sink head whose query edge first-order attribution misses (AtP*'s QK fix).

The residual stream carries two constant channels at +-K (K = 1000), so every LayerNorm
divides by the same scale and the hand-built heads are linear in what they read. Attention
heads with zero query/key weights attend uniformly; every MLP writes nothing.

Planted circuit (metric: channel C at the last position after block 1): head 0.0 copies the
token signal A into C, head 1.1 copies C into C again, so the circuit is exactly
embed -> L0H0.v, L0H0 -> metric, L0H0 -> L1H1.v, L1H1 -> metric. Decoy: head 0.3 writes a
large token signal (20x) into a channel nothing reads.

Saturated case: head 1.1 instead attends to position 0 with a score of 10 (query: a constant
channel; key: a position-0 marker) and copies the marker into C, so it writes ~1. Head 0.2
reads a flag that only corrupted tokens carry and writes -2 into the query channel: the edge
L0H2 -> L1H1.q flips the score to -10 and removes the head's write (exact effect ~ -1), but
the saturated softmax's gradient is ~3e-4, so plain EAP scores it ~ -0.005, below a linear edge
of effect -0.6 (head 0.0's direct write).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from mechsink.discover import (
    GraphRun,
    curve,
    discover,
    eap,
    eap_ig,
    edges_from_names,
    exact_scores,
    faithfulness,
    greedy,
    top_n,
)
from mechsink.model import hf_model_of
from mechsink.patching import MassiveValue
from mechsink.viz.discover import draw_discovery

K, D, DH, SEQ = 1000.0, 64, 16, 6
Z, Z2, A, A2, C, C2, DD, DD2, E, E2, G, G2, M, M2, QZ, QZ2 = range(16)
PLANTED = {"embed->L0H0.v", "L0H0->metric", "L0H0->L1H1.v", "L1H1->metric"}
QK_EDGE, LINEAR_EDGE = "L0H2->L1H1.q", "L0H0->metric"
METRIC = MassiveValue(1, SEQ - 1, C)


def build(saturated: bool):
    from mechsink import load_model

    model = load_model("random:gpt2-tiny", device="cpu", seed=0)
    tr = hf_model_of(model).transformer
    s = K * math.sqrt(2 / D)  # the LayerNorm scale of a residual with two channels at +-K
    with torch.no_grad():
        tr.wte.weight.zero_()
        tr.wpe.weight.zero_()
        tr.wpe.weight[:, Z], tr.wpe.weight[:, Z2] = K, -K
        for lo, sign in ((100, 1.0), (200, -1.0)):  # clean tokens 100..199, corrupted 200..299
            rows = slice(lo, lo + 100)
            for ch, partner in ((A, A2), (DD, DD2)):
                tr.wte.weight[rows, ch], tr.wte.weight[rows, partner] = sign, -sign
        if saturated:
            tr.wte.weight[200:300, G], tr.wte.weight[200:300, G2] = 1.0, -1.0
            tr.wpe.weight[0, M], tr.wpe.weight[0, M2] = 1.0, -1.0
            tr.wpe.weight[:, QZ], tr.wpe.weight[:, QZ2] = 1.0, -1.0
        for block in tr.h:
            for lin in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_proj):
                lin.weight.zero_()
                lin.bias.zero_()

        def read(layer: int, head: int, which: int, ch: int, gain: float) -> None:
            # c_attn: x @ W, columns [q | k | v], head h at h*DH..; we use the head's dim 0
            tr.h[layer].attn.c_attn.weight[ch, which * D + head * DH] = s * gain

        def write(layer: int, head: int, ch: int, partner: int, gain: float) -> None:
            tr.h[layer].attn.c_proj.weight[head * DH, ch] = gain
            tr.h[layer].attn.c_proj.weight[head * DH, partner] = -gain

        read(0, 0, 2, A, 1.0)
        write(0, 0, C, C2, 0.3 if saturated else 1.0)
        read(0, 3, 2, DD, 1.0)  # the decoy: a big write nobody reads
        write(0, 3, E, E2, 20.0)
        if saturated:
            read(0, 2, 2, G, 1.0)
            write(0, 2, QZ2, QZ, 2.0)  # -2 into QZ where corrupted tokens are
            read(1, 1, 0, QZ, 40.0)  # query . key / sqrt(16) = 10 at key 0
            read(1, 1, 1, M, 1.0)
            read(1, 1, 2, M, 1.0)
        else:
            read(1, 1, 2, C, 1.0)
        write(1, 1, C, C2, 1.0)
    return model


def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randint(100, 200, (2, SEQ), generator=g),
            torch.randint(200, 300, (2, SEQ), generator=g))


@pytest.fixture(scope="module")
def planted():
    return build(saturated=False)


@pytest.fixture(scope="module")
def saturated():
    return build(saturated=True)


def test_the_hand_built_model_computes_what_it_should(planted):
    """The metric by hand: head 0.0 writes the mean token signal (uniform causal attention),
    head 1.1 adds the mean of those writes: clean +1 + 1 = 2, corrupted -2."""
    clean, corr = inputs()
    run = GraphRun(planted, clean, METRIC, corrupted=corr)
    assert run.clean_value == pytest.approx(2.0, abs=1e-3)
    assert run.corrupted_value == pytest.approx(-2.0, abs=1e-3)


@pytest.mark.parametrize("method", ["eap", "eap-ig", "exact"])
def test_every_method_ranks_the_planted_edges_first(planted, method):
    clean, corr = inputs()
    run = GraphRun(planted, clean, METRIC, corrupted=corr)
    if method == "eap":
        scores = eap(run, verify=0)
    elif method == "eap-ig":
        scores = eap_ig(run, steps=3, qk_fix=False, verify=0)
    else:
        scores = exact_scores(run)
    top = [name for name, _ in scores.top(len(PLANTED))]
    assert set(top) == PLANTED
    rest = scores.values[scores.order()[len(PLANTED):]].abs().max()
    assert float(rest) < 1e-2 * float(scores.values.abs().max())
    # the faithfulness curve reaches 1 at the planted size and stays there
    c = curve(run, scores.order().tolist(), sizes=[0, 2, 4, 8, run.graph.n_edges], n_random=2)
    assert c.values[0] == pytest.approx(0.0, abs=1e-6)
    assert c.values[2] == pytest.approx(1.0, abs=1e-3) and c.values[1] < 0.9
    assert c.values[3] == pytest.approx(1.0, abs=1e-3)
    assert c.size_reaching(0.999) == 4 and c.auc > c.random_auc


def test_greedy_finds_the_planted_circuit_and_json_round_trip(planted, tmp_path):
    clean, corr = inputs()
    run = GraphRun(planted, clean, METRIC, corrupted=corr)
    scores = eap(run, verify=0)
    found = greedy(run, scores, target=0.999, window=6)
    assert set(found.names) == PLANTED and found.faithfulness == pytest.approx(1.0, abs=1e-3)
    path = found.save(tmp_path / "circuit.json")
    names = [e["edge"] for e in json.loads(path.read_text())["edges"]]
    assert edges_from_names(run.graph, names) == found.edges
    only_two = top_n(scores, 2)
    assert float(faithfulness(run, only_two.mask().unsqueeze(0))[0]) < 0.9


def test_discover_writes_scores_circuit_curves_and_figures(planted, tmp_path):
    clean, _ = inputs()
    found = discover(planted, clean, METRIC, ablation="zero", method="eap", verify=4,
                     curve_ablations=["batch_mean"], n_random=1)
    assert {c.ablation for c in found.curves} == {"zero", "batch_mean"}
    # every clean prompt carries the same signal: a batch mean changes nothing, the curve is NaN
    assert all(math.isnan(v) for v in found.curves[1].values)
    assert found.curves[0].values[-1] == pytest.approx(1.0)
    found.save(tmp_path)
    draw_discovery(tmp_path)  # the figures, drawn from the saved JSON
    for name in ("discover.json", "circuit.json", "circuit.png", "faithfulness.png",
                 "summary.md"):
        assert (tmp_path / name).stat().st_size > 0
    data = json.loads((tmp_path / "discover.json").read_text())
    assert len(data["scores"]["checks"]) == 4 and data["circuit"]["n_edges"] >= 1


def test_qk_fix_ranks_the_saturated_query_edge_right(saturated):
    clean, corr = inputs()
    run = GraphRun(saturated, clean, METRIC, corrupted=corr)
    ex = exact_scores(run)
    plain = eap(run, qk_fix=False, verify=0)
    fixed = eap(run, qk_fix=True, verify=3)
    g = run.graph
    q, lin = g.edge_index(QK_EDGE), g.edge_index(LINEAR_EDGE)
    # the exact patch: the query edge matters more than the linear one
    assert float(ex.values[q]) == pytest.approx(-1.0, abs=0.01)
    assert float(ex.values[lin]) == pytest.approx(-0.6, abs=0.01)
    # plain EAP sees almost nothing through the saturated softmax: ranked below the linear edge
    assert abs(float(plain.values[q])) < 0.05
    assert plain.order().tolist().index(q) > plain.order().tolist().index(lin)
    # the QK fix recomputes the pattern: the query edge ranks with the head's own write (both
    # ~ -1), above the linear edge, at its exact size
    assert set(fixed.order()[:2].tolist()) == {q, g.edge_index("L1H1->metric")}
    assert float(fixed.values[q]) == pytest.approx(float(ex.values[q]), rel=0.02)
    assert fixed.first_order is not None and float(fixed.first_order[q]) == pytest.approx(
        float(plain.values[q]))
    check = next(c for c in fixed.checks if c["edge"] == QK_EDGE)
    assert check["exact"] == pytest.approx(float(ex.values[q]), abs=1e-6)
    assert check["first_order"] == pytest.approx(float(plain.values[q]))
