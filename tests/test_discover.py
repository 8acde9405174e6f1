"""Edge discovery on tiny models: exact edge patches against path_patch, EAP against a finite
difference written with TransformerLens hooks, EAP-IG against the exact patch and the total
effect, TransformerLens 4.3's own edge attribution, and the graph's shape on GQA models."""

from __future__ import annotations

import math

import pytest
import torch

from mechsink.discover import (
    Graph,
    GraphRun,
    eap,
    eap_ig,
    exact_scores,
    graph_mode,
    metric_point,
    node_circuit_edges,
)
from mechsink.errors import BadInputError
from mechsink.model import act_name
from mechsink.patching import LogitDiff, MassiveValue, SinkScore, path_patch


def tokens(seed: int, batch: int = 2, seq: int = 7) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, 500, (batch, seq), generator=g)


CLEAN, CORR = tokens(0), tokens(1)


def sample(graph: Graph, per_kind: int = 2) -> list[int]:
    """A few edges into every kind of receiver."""
    out: dict[str, list[int]] = {}
    for e in range(graph.n_edges):
        kind = graph.receivers[int(graph.dst[e])].kind
        if len(out.setdefault(kind, [])) < per_kind:
            out[kind].append(e)
        elif e % 7 == 0 and len(out[kind]) < 2 * per_kind:
            out[kind].append(e)
    return [e for v in out.values() for e in v]


def test_graph_counts_on_gqa(llama_tiny):
    """4 query heads / 2 KV heads, 2 layers, a logit metric: 1 + 2*(4+1) senders; per layer 4 q,
    2 k, 2 v, 1 MLP receivers, plus the metric; an edge wherever the sender writes first."""
    g = Graph.build(llama_tiny, LogitDiff(11, 12))
    assert [s.name for s in g.senders][:6] == ["embed", "L0H0", "L0H1", "L0H2", "L0H3", "MLP0"]
    assert len(g.senders) == 11 and len(g.receivers) == 2 * 9 + 1
    assert "L1KV1.k" in [r.name for r in g.receivers]
    # layer 0's attention reads embed only (8 edges), MLP0 reads embed + 4 heads, layer 1's
    # 8 attention receivers read 6 senders, MLP1 reads 10, the metric reads all 11
    assert g.n_edges == 8 * 1 + 5 + 8 * 6 + 10 + 11
    # a sink-score metric at layer 1 reads layer 1's attention input: layer 1 is not in the graph
    g1 = Graph.build(llama_tiny, SinkScore(1))
    assert g1.n_layers == 1 and metric_point(llama_tiny, SinkScore(1)).kind == "attn"
    assert g1.n_edges == 8 + 5 + 6
    with pytest.raises(BadInputError, match="before any component"):
        Graph.build(llama_tiny, SinkScore(0))


@pytest.mark.parametrize("fixture", ["llama_tiny", "gpt2_tiny"])
@pytest.mark.parametrize("case", ["logits", "sink", "massive_posmean"])
def test_exact_edge_patch_equals_path_patch(request, fixture, case):
    model = request.getfixturevalue(fixture)
    if case == "logits":
        metric, kw, at = LogitDiff(11, 12), {"corrupted": CORR}, ""
    elif case == "sink":
        metric, kw, at = SinkScore(1), {"corrupted": CORR}, ""
    else:
        metric, kw, at = MassiveValue(1, 0, 3), {"ablation": "position_mean",
                                                 "positions": [0]}, "@0"
    run = GraphRun(model, CLEAN, metric, **kw)
    edges = sample(run.graph)
    ours = exact_scores(run, edges=edges).values
    for e in edges:
        s, r = run.graph.path_spec(e)
        pp = path_patch(model, CLEAN, kw.get("corrupted"), [s + at], [r], metric,
                        ablation=kw.get("ablation"), batch_size=1)
        assert float(ours[e]) == pytest.approx(float(pp.values[0]) - pp.clean_value, abs=1e-5)
    assert math.isnan(float(ours[[e for e in range(run.graph.n_edges) if e not in edges][0]]))


def test_eap_equals_finite_difference_with_plain_hooks(llama_tiny):
    """EAP's score of an edge is the derivative of the metric when the receiver's input moves
    by eps times the sender's corrupted-minus-clean write: computed here with nothing but
    run_with_hooks on TransformerLens's per-head input hooks."""
    model, metric = llama_tiny, LogitDiff(11, 12)
    run = GraphRun(model, CLEAN, metric, corrupted=CORR)
    scores = eap(run, qk_fix=False, verify=0).values
    with torch.no_grad(), graph_mode(model):
        _, c = model.run_with_cache(CLEAN)
        _, x = model.run_with_cache(CORR)
    names = {"q": "hook_q_input", "k": "hook_k_input", "v": "hook_v_input"}
    g = run.graph
    checked = 0
    for e in sample(g, 3):
        s, r = g.senders[int(g.src[e])], g.receivers[int(g.dst[e])]
        if s.kind == "embed":
            delta = x[act_name("resid_pre", 0)] - c[act_name("resid_pre", 0)]
        elif s.kind == "head":
            hk = act_name("result", s.layer)
            delta = (x[hk] - c[hk])[:, :, s.index]
        else:
            delta = x[act_name("mlp_out", s.layer)] - c[act_name("mlp_out", s.layer)]

        def value(eps: float, r=r, delta=delta) -> float:
            if r.kind in names:
                hook = act_name(f"attn.{names[r.kind]}", r.layer)

                def fn(act, hook):
                    act = act.clone()
                    act[:, :, r.index] += eps * delta
                    return act
            elif r.kind == "mlp":
                hook = act_name("hook_mlp_in", r.layer)

                def fn(act, hook):
                    return act + eps * delta
            else:
                hook = act_name("resid_post", model.cfg.n_layers - 1)

                def fn(act, hook):
                    act.add_(eps * delta)
                    return act
            with torch.no_grad(), graph_mode(model):
                logits = model.run_with_hooks(CLEAN, fwd_hooks=[(hook, fn)])
            return float((logits[:, -1, 11] - logits[:, -1, 12]).mean())

        eps = 1e-2
        fd = (value(eps) - value(-eps)) / (2 * eps)
        assert float(scores[e]) == pytest.approx(fd, abs=2e-4 + 0.02 * abs(fd))
        checked += 1
    assert checked >= 8


def test_eap_ig_on_one_edge_is_its_exact_patch(llama_tiny):
    """Integrated gradients along one edge's coefficient (0 -> 1) is that edge's exact patch."""
    run = GraphRun(llama_tiny, CLEAN, SinkScore(1), corrupted=CORR)
    ex = exact_scores(run).values
    e = int(ex.abs().argmax())
    ig = eap_ig(run, steps=24, ig="coefficients", edges=[e], qk_fix=False, verify=0).values
    assert float(ig[e]) == pytest.approx(float(ex[e]), rel=2e-3, abs=1e-7)


def test_eap_ig_approaches_the_total_effect(gpt2_tiny):
    """EAP-IG on edge coefficients adds up to m(corrupted) - m(clean) (the corrupted run's metric
    from a plain forward), and gets closer as steps grow; plain EAP does not."""
    run = GraphRun(gpt2_tiny, CLEAN, LogitDiff(11, 12), corrupted=CORR)
    with torch.no_grad():
        lc, lx = gpt2_tiny(CLEAN), gpt2_tiny(CORR)
    total = float((lx[:, -1, 11] - lx[:, -1, 12]).mean() - (lc[:, -1, 11] - lc[:, -1, 12]).mean())
    errs = [abs(float(eap_ig(run, steps=s, ig="coefficients", qk_fix=False,
                             verify=0).values.sum()) - total)
            for s in (1, 3, 12)]
    assert errs[2] < 0.01 * abs(total) and errs[2] < errs[1] < errs[0]
    # with more steps, the estimate of each edge moves towards the exact patch on average
    run = GraphRun(gpt2_tiny, CLEAN, SinkScore(1), corrupted=CORR)
    ex = exact_scores(run).values
    err = [float((eap_ig(run, steps=s, qk_fix=False, verify=0).values - ex).abs().mean())
           for s in (1, 6)]
    assert err[1] < err[0]


def test_matches_transformer_lens_edge_attribution(gpt2_tiny):
    """TransformerLens 4.3's edge attribution (transformer_lens.tools.analysis,
    denoising: gradient at the corrupted run, (clean - corrupted) writes, one node per
    position) equals our EAP with clean and corrupted swapped, summed over positions."""
    ap = pytest.importorskip("transformer_lens.tools.analysis.attribution_patching")
    c, x = CLEAN[:1], CORR[:1]
    theirs = ap.attribution_patch(
        gpt2_tiny, c, x, lambda logits: logits[0, -1, 11] - logits[0, -1, 12],
        ap.EdgeAttributionConfig(granularity="edge"))
    run = GraphRun(gpt2_tiny, x, LogitDiff(11, 12), corrupted=c)
    ours = eap(run, qk_fix=False, verify=0)
    g = ours.graph
    kinds = {"q_input": "q", "k_input": "k", "v_input": "v"}
    summed: dict[str, float] = {}
    for (w, rd), v in theirs.edge_scores.items():
        s = {"embed": "embed", "attn_head_out": f"L{w.layer}H{w.head}",
             "mlp_out": f"MLP{w.layer}"}[w.kind]
        if rd.kind in kinds:
            r = f"L{rd.layer}H{rd.head}.{kinds[rd.kind]}"
        else:
            r = "metric" if rd.kind == "logits" else f"MLP{rd.layer}"
        if w.position != rd.position and rd.kind not in kinds:
            continue
        summed[f"{s}->{r}"] = summed.get(f"{s}->{r}", 0.0) + v
    assert set(summed) <= set(g.edge_names) and len(summed) == g.n_edges
    for name, v in summed.items():
        assert float(ours.values[g.edge_index(name)]) == pytest.approx(v, abs=1e-5)


def test_node_circuit_edges_and_errors(llama_tiny):
    g = Graph.build(llama_tiny, LogitDiff(11, 12))
    kept = [g.edge_names[e] for e in node_circuit_edges(g, ["L0H1", "MLP0", "L1H2"])]
    assert "embed->L0H1.q" in kept and "L0H1->MLP0" in kept and "MLP0->L1KV1.v" in kept
    assert "L0H1->L1H2.q" in kept and "L1H2->metric" in kept
    assert "embed->L0H0.q" not in kept and "L0H0->MLP0" not in kept
    assert "MLP0->L1KV0.k" not in kept  # KV head 0 serves query heads 0 and 1 only
    with pytest.raises(BadInputError, match="either corrupted"):
        GraphRun(llama_tiny, CLEAN, SinkScore(1))
    with pytest.raises(BadInputError, match="positions"):
        GraphRun(llama_tiny, CLEAN, SinkScore(1), ablation="position_mean")
    run = GraphRun(llama_tiny, CLEAN, SinkScore(1), ablation="zero")
    with pytest.raises(BadInputError, match="steps"):
        eap_ig(run, steps=0)
    with pytest.raises(BadInputError, match="no edge"):
        g.edge_index("L9H9->metric")


def test_exact_edge_patches_reuse_the_clean_prefix(llama_tiny):
    """GraphRun records the clean run with its keys and values (engine.setup): edges
    corrupted from position 3 on are patched computing positions 3.. only, and give what
    recomputing every position gives, and what path_patch gives."""
    from mechsink.patching import engine

    run = GraphRun(llama_tiny, CLEAN, SinkScore(1), ablation="position_mean", positions=[3, 5])
    assert run.clean.kv is not None and run.first_position == 3
    edges = sample(run.graph)
    reused = exact_scores(run, edges=edges).values
    engine.SPEEDUPS["prefix_reuse"] = False
    try:
        full = exact_scores(run, edges=edges).values
    finally:
        engine.SPEEDUPS["prefix_reuse"] = True
    torch.testing.assert_close(reused[edges], full[edges], atol=1e-6, rtol=1e-6)
    for e in edges[:4]:
        s, r = run.graph.path_spec(e)
        pp = path_patch(llama_tiny, CLEAN, None, [[s + "@3", s + "@5"]], [r], SinkScore(1),
                        ablation="position_mean", batch_size=1)
        assert float(reused[e]) == pytest.approx(float(pp.values[0]) - pp.clean_value,
                                                 abs=1e-5)


def test_the_empty_circuit_value_has_a_home_on_the_run(llama_tiny):
    """m(every edge corrupted) is GraphRun.empty_value, computed once (before: a private
    attribute that faithfulness set and curves read back with a default)."""
    from mechsink.discover import curve, faithfulness

    run = GraphRun(llama_tiny, CLEAN, SinkScore(1), corrupted=CORR)
    with torch.no_grad():
        _, cache = llama_tiny.run_with_cache(CORR)
    corrupted = SinkScore(1)(_outputs(cache, act_name("pattern", 1)))
    assert run.empty_value == pytest.approx(float(corrupted), abs=1e-6)
    assert run.empty_value == run.corrupted_value
    c = curve(GraphRun(llama_tiny, CLEAN, SinkScore(1), corrupted=CORR), [0, 1], n_random=0,
              sizes=[0, 2])
    assert c.empty_value == pytest.approx(run.empty_value)
    none = faithfulness(run, torch.zeros(1, run.graph.n_edges, dtype=torch.bool))
    assert float(none[0]) == pytest.approx(0.0, abs=1e-6)


def _outputs(cache, hook):
    from mechsink.patching import Outputs

    return Outputs(CLEAN.shape[1], {hook: cache[hook]})


def test_methods_are_found_in_the_registry(llama_tiny):
    """Every method is a registered file; a new one is one register() call, and discover()
    and score_edges run it by name with the options it declares."""
    from mechsink.discover import METHODS, discover, register, score_edges
    from mechsink.discover.methods import _REGISTRY, Option, options_for
    from mechsink.discover.scores import result

    assert list(METHODS) == ["eap", "eap-ig", "exact"]
    assert METHODS["eap-ig"].options == ("steps", "ig", "qk_fix", "verify", "edges",
                                         "convention")
    assert options_for("exact", {"qk_fix": True, "batch_size": 2}) == {"batch_size": 2}
    calls = []

    @register("by-sender", options=(Option("verify", int, 0, "edges to re-check"),))
    def by_sender(run, *, verify: int = 0):
        """Every edge scored by its sender's number (a test method)."""
        calls.append(verify)
        return result(run, run.graph.src.double(), "by-sender", {})

    try:
        run = GraphRun(llama_tiny, CLEAN, SinkScore(1), corrupted=CORR)
        assert score_edges(run, "by-sender").method == "by-sender"
        with pytest.raises(BadInputError, match="takes verify, not steps"):
            score_edges(run, "by-sender", steps=3)
        found = discover(llama_tiny, CLEAN, SinkScore(1), corrupted=CORR, method="by-sender",
                         verify=7, n_random=0, n_edges=3)
        assert found.scores.method == "by-sender" and calls == [0, 7]
        assert found.circuit.edges == found.scores.order()[:3].tolist()
    finally:
        _REGISTRY.pop("by-sender")
    with pytest.raises(BadInputError, match="unknown method 'acdc': choose one of eap"):
        discover(llama_tiny, CLEAN, SinkScore(1), corrupted=CORR, method="acdc")


def test_methods_declare_the_choices_the_command_line_checks():
    """A method's named-value options are declared beside it; the discover job checks them
    from the registry (no import of a method's module), and a method cannot declare choices
    for an option it does not take."""
    from mechsink.discover import register
    from mechsink.discover.methods import _REGISTRY, METHODS, Option, option_choices
    from mechsink.discover.methods.eap_ig import CONVENTIONS, PATHS
    from mechsink.jobs.discover import Spec, check_choices
    from mechsink.jobs.spec import SettingError

    assert METHODS["eap-ig"].choices == {"ig": PATHS, "convention": CONVENTIONS}
    assert option_choices() == {"ig": PATHS, "convention": CONVENTIONS}
    with pytest.raises(ValueError, match="does not take"):
        register("bad-choices", options=(Option("steps", str, "a", "", choices=("a",)),))(
            lambda run, *, ig="x": None)
    assert "bad-choices" not in _REGISTRY
    spec = Spec(metric="kl", method_options={"ig": "gradients"})
    with pytest.raises(SettingError, match="--ig must be inputs, activations or coefficients"):
        check_choices(spec)
