"""EAP-IG on activations (one sender group at a time: Marks et al. 2024, "Sparse Feature
Circuits"; Hanna et al. 2024's EAP-IG-activations) against a finite difference written with
nothing but TransformerLens hooks, its per-group completeness against a node patch made by
hand, the plain-gradient path against graph mode, and the memory budget's chunking."""

from __future__ import annotations

import pytest
import torch

from mechsink.discover import GraphRun, eap_ig, graph_mode, plain_grads
from mechsink.discover.methods.eap_ig import sender_groups
from mechsink.errors import BadInputError
from mechsink.model import act_name
from mechsink.patching import LogitDiff, MassiveValue


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(5, 500, (2, 7), generator=torch.Generator().manual_seed(seed))


CLEAN, CORR = _tokens(0), _tokens(1)
QKV = {"q": "hook_q_input", "k": "hook_k_input", "v": "hook_v_input"}


def _caches(model):
    with torch.no_grad(), graph_mode(model):
        _, c = model.run_with_cache(CLEAN)
        _, x = model.run_with_cache(CORR)
    return c, x


def _write_hook(sender) -> tuple[str, int | None]:
    """Where a sender's write is, by TransformerLens's names, and its head (or None)."""
    if sender.kind == "embed":
        return act_name("resid_pre", 0), None
    if sender.kind == "head":
        return act_name("result", sender.layer), sender.index
    return act_name("mlp_out", sender.layer), None


def _delta(sender, c, x) -> torch.Tensor:
    hook, head = _write_hook(sender)
    d = x[hook] - c[hook]
    return d if head is None else d[:, :, head]


def _logit_diff(model, hooks) -> float:
    with torch.no_grad(), graph_mode(model):
        logits = model.run_with_hooks(CLEAN, fwd_hooks=hooks)
    return float((logits[:, -1, 11] - logits[:, -1, 12]).mean())


def _move_group(group, alpha, c, x):
    """Hooks moving every sender of ``group`` a fraction ``alpha`` to its corrupted write."""
    hooks = []
    for s in group:
        hook, head = _write_hook(s)
        d = alpha * _delta(s, c, x)

        def fn(act, hook, d=d, head=head):
            act = act.clone()
            if head is None:
                act += d
            else:
                act[:, :, head] += d
            return act
        hooks.append((hook, fn))
    return hooks


def _into_receiver(model, r, d):
    """A hook adding ``d`` to receiver ``r``'s own input (graph mode's per-head forks)."""
    if r.kind in QKV:
        def fn(act, hook):
            act = act.clone()
            act[:, :, r.index] += d
            return act
        return act_name(f"attn.{QKV[r.kind]}", r.layer), fn
    if r.kind == "mlp":
        return act_name("hook_mlp_in", r.layer), lambda act, hook: act + d
    return act_name("resid_post", model.cfg.n_layers - 1), lambda act, hook: act + d


def test_ig_on_activations_equals_a_finite_difference_by_hand(llama_tiny):
    """Each score is the mean over the midpoints alpha of d m / d eps, where the sender's
    whole group (embedding, a layer's heads, an MLP) is moved alpha of the way to corrupted
    and the receiver's input gets eps times the sender's corrupted-minus-clean write: written
    here with run_with_hooks on the model's own hook points, deltas from its own caches."""
    model, steps = llama_tiny, 2
    run = GraphRun(model, CLEAN, LogitDiff(11, 12), corrupted=CORR)
    scores = eap_ig(run, steps=steps, ig="activations", qk_fix=False, verify=0).values
    c, x = _caches(model)
    g = run.graph
    alphas = [(k + 0.5) / steps for k in range(steps)]
    checked: set[str] = set()
    for e in range(g.n_edges):
        s, r = g.senders[int(g.src[e])], g.receivers[int(g.dst[e])]
        key = f"{s.kind}{s.layer}->{r.kind}"
        if key in checked or (s.kind == "head" and s.index != 1):
            continue
        checked.add(key)
        group = [u for u in g.senders if u.stage == s.stage]
        d = _delta(s, c, x)
        fd = 0.0
        for alpha in alphas:
            moved = _move_group(group, alpha, c, x)
            eps = 1e-2
            up = _logit_diff(model, moved + [_into_receiver(model, r, eps * d)])
            down = _logit_diff(model, moved + [_into_receiver(model, r, -eps * d)])
            fd += (up - down) / (2 * eps) / steps
        assert float(scores[e]) == pytest.approx(fd, abs=2e-4 + 0.02 * abs(fd)), g.edge_names[e]
    assert len(checked) >= 10  # every sender kind into every receiver kind it reaches


def test_each_groups_scores_add_up_to_its_node_patch(gpt2_tiny):
    """As steps grow, the scores of the edges out of one group add up to the metric with that
    group's writes corrupted (everything downstream live) minus the clean metric."""
    model = gpt2_tiny
    run = GraphRun(model, CLEAN, LogitDiff(11, 12), corrupted=CORR)
    c, x = _caches(model)
    clean = _logit_diff(model, [])
    g = run.graph
    scores = {s: eap_ig(run, steps=s, ig="activations", qk_fix=False, verify=0).values
              for s in (1, 16)}
    for group in sender_groups(run)[1:]:  # the embedding's is every edge out of it: below
        senders = [g.senders[i] for i in group]
        effect = _logit_diff(model, _move_group(senders, 1.0, c, x)) - clean
        out = torch.isin(g.src, torch.tensor(group))
        errs = [abs(float(scores[s][out].sum()) - effect) for s in (1, 16)]
        assert errs[1] <= 0.01 * abs(effect) + 1e-5 and errs[1] <= errs[0] + 1e-6
    embed = g.src == 0
    total = float(scores[16][embed].sum())
    assert total == pytest.approx(_logit_diff(model, _move_group([g.senders[0]], 1.0, c, x))
                                  - clean, rel=0.01, abs=1e-5)


@pytest.mark.parametrize("fixture, metric, how", [
    ("llama_tiny", LogitDiff(11, 12), {"corrupted": CORR, "neurons": {0: [3, 17]}}),
    ("gpt2_tiny", MassiveValue(1, 0, 3), {"ablation": "position_mean", "positions": [0],
                                          "neurons": {1: [5]}}),
])
def test_plain_gradients_equal_graph_mode(request, monkeypatch, fixture, metric, how):
    """The plain runs (from the group's block, its writes added where they enter the
    residual stream) give graph mode's scores, neuron senders included."""
    model = request.getfixturevalue(fixture)
    run = GraphRun(model, CLEAN, metric, **how)
    fast = eap_ig(run, steps=3, ig="activations", qk_fix=False, verify=0).values
    monkeypatch.setattr(plain_grads, "ENABLED", False)
    slow = eap_ig(run, steps=3, ig="activations", qk_fix=False, verify=0).values
    assert float((fast - slow).abs().max()) <= 1e-5 * max(1.0, float(slow.abs().max()))
    assert float(slow.abs().max()) > 0


def test_a_small_memory_budget_chunks_the_steps_not_the_result(llama_tiny):
    """One copy per forward (a tiny budget) gives the scores of all steps stacked at once."""
    wide = GraphRun(llama_tiny, CLEAN, LogitDiff(11, 12), corrupted=CORR)
    narrow = GraphRun(llama_tiny, CLEAN, LogitDiff(11, 12), corrupted=CORR)
    narrow.chunk_budget = 1  # set up within the default budget, then chunked to one copy
    assert narrow.copies_per_forward(injects=False) == 1 < wide.copies_per_forward(
        injects=False)
    a = eap_ig(wide, steps=4, ig="activations", qk_fix=False, verify=0).values
    b = eap_ig(narrow, steps=4, ig="activations", qk_fix=False, verify=0).values
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9)


def test_bad_ig_options_are_refused(llama_tiny):
    run = GraphRun(llama_tiny, CLEAN, LogitDiff(11, 12), corrupted=CORR)
    with pytest.raises(BadInputError, match="'coefficients'"):
        eap_ig(run, ig="layers")
    with pytest.raises(BadInputError, match="ig='coefficients'"):
        eap_ig(run, ig="activations", edges=[0])


@pytest.mark.parametrize("fixture", ["llama_tiny", "gpt2_tiny"])
def test_graph_mode_group_runs_equal_edge_coefficients(request, fixture):
    """The graph-mode group run (the group's writes added where they enter the residual)
    gives the gradients of run_coeffs with alpha on every edge out of the group, at every
    receiver after the group."""
    from mechsink.discover.methods.eap_ig import graph_group_grads, group_rows

    model = request.getfixturevalue(fixture)
    run = GraphRun(model, CLEAN, LogitDiff(11, 12), corrupted=CORR)
    g = run.graph
    for group in sender_groups(run):
        coeffs = torch.zeros(2, len(g.senders), len(g.receivers))
        coeffs[:, group] = g.valid[group].float()
        coeffs *= torch.tensor([0.25, 0.75]).view(-1, 1, 1)
        ref = run.run_coeffs(coeffs, with_grad=True)[1]
        got = graph_group_grads(run, group, [0.25, 0.75])
        def summed(grads):  # the two copies' gradients added, as the method does
            return {k: v.view(2, run.batch, *v.shape[1:]).sum(0) for k, v in grads.items()}

        a, b = group_rows(run, summed(got), group), group_rows(run, summed(ref), group)
        assert float((a - b).abs().max()) <= 1e-5 * max(1.0, float(b.abs().max()))
        assert float(b.abs().max()) > 0
