"""The fast paths of edge discovery against the computations they replaced (1e-5): the
per-staircase-step matrix product of sender deltas and receiver gradients against the old
per-receiver-slot einsum."""

from __future__ import annotations

import pytest
import torch

from mechsink.discover import GraphRun, eap, eap_ig
from mechsink.discover import scores as sc
from mechsink.patching import KLToClean, MassiveValue, SinkScore


def _tokens(seed: int, batch: int = 3, seq: int = 7) -> torch.Tensor:
    t = torch.randint(5, 500, (batch, seq), generator=torch.Generator().manual_seed(seed))
    t[:, 0] = 1
    return t


def slow_from_grads(run, grads):
    """The old computation: one einsum per receiver slot, the delta's prefix in float64."""
    g = run.graph
    out = torch.zeros(len(g.senders), len(g.receivers), dtype=torch.float64)
    for slot in run.slots():
        grad = grads.get(slot.hook)
        if grad is None:
            continue
        n_s = g.n_senders_before(g.receivers[slot.cols[0]])
        d = run.delta[:, :, :n_s].double()
        grad = grad.double()
        if slot.heads and slot.broadcast:
            grad = grad.sum(2)
        if slot.heads and not slot.broadcast:
            vals = torch.einsum("bsud,bshd->uh", d, grad)
        else:
            vals = torch.einsum("bsud,bsd->u", d, grad).unsqueeze(1)
        out[:n_s, slot.cols] += vals
    return out


CASES = [  # (fixture, metric, corruption): attention, post-block and logit metric points
    ("llama_tiny", SinkScore(1), {"corrupted": _tokens(1)}),
    ("llama_tiny", MassiveValue(1, 0, 3), {"ablation": "position_mean", "positions": [0]}),
    ("gpt2_tiny", KLToClean(-1), {"corrupted": _tokens(1)}),
    ("gpt2_tiny", SinkScore(1), {"ablation": "zero", "positions": [0, 3]}),
]


@pytest.mark.parametrize("fixture, metric, how", CASES)
def test_fast_scores_equal_the_per_slot_einsum(request, fixture, metric, how):
    model = request.getfixturevalue(fixture)
    run = GraphRun(model, _tokens(0), metric, **how)
    grads = sc.clean_gradients(run)
    fast, slow = sc.from_grads(run, grads), slow_from_grads(run, grads)
    scale = float(slow.abs().max())
    assert scale > 0
    assert (fast - slow).abs().max() <= 1e-5 * max(1.0, scale)
    # and through the methods (EAP; EAP-IG on inputs, whose steps move the embedding)
    e = eap(run, qk_fix=False, verify=0)
    assert (e.values - slow[run.graph.src, run.graph.dst]).abs().max() <= 1e-5 * max(1.0, scale)
    ig = eap_ig(run, steps=2, ig="inputs", qk_fix=False, verify=0)
    ref = torch.zeros_like(slow)
    path = torch.zeros_like(slow)
    path[0] = run.graph.valid[0].double()
    for k in range(2):
        _, gr, _ = run.run_coeffs((((k + 0.5) / 2) * path).unsqueeze(0), with_grad=True)
        ref += slow_from_grads(run, gr)
    ref = (ref / 2)[run.graph.src, run.graph.dst]
    assert (ig.values - ref).abs().max() <= 1e-5 * max(1.0, float(ref.abs().max()))


@pytest.mark.parametrize("fixture, metric, how", CASES)
def test_exact_edges_on_the_staircase_equal_one_layer_per_batch(request, fixture, metric, how,
                                                                monkeypatch):
    """Exact edge patches share a forward across receiver layers (each copy joins at its
    receiver's block): the same values as batches of one receiver layer."""
    from mechsink.patching import plan

    model = request.getfixturevalue(fixture)
    run = GraphRun(model, _tokens(0), metric, **how)
    edges = torch.randperm(run.graph.n_edges, generator=torch.Generator().manual_seed(0))[:24]
    stair = run.exact(edges.tolist(), batch_size=7)
    monkeypatch.setitem(plan.SPEEDUPS, "staircase", False)
    per_layer = run.exact(edges.tolist(), batch_size=7)
    assert (stair - per_layer).abs().max() <= 1e-5 * max(1.0, float(per_layer.abs().max()))
    assert (per_layer - run.clean_value).abs().max() > 1e-6


@pytest.mark.parametrize("fixture, metric, how", CASES)
def test_exact_edges_without_forks_equal_transformer_lens_per_head_inputs(
        request, fixture, metric, how, monkeypatch):
    """Exact edge patches on the plain model (each query/key/value receiver's change added at
    ``attn.hook_q/k/v`` as ``(ln1(R + d) - ln1(R)) W[h]``) equal the same patches on
    TransformerLens's per-head input copies (``use_split_qkv_input``: the head's own
    ``hook_q_input`` gets ``d``), on every receiver kind, the metric's included."""
    from mechsink.discover import plain_grads

    model = request.getfixturevalue(fixture)
    run = GraphRun(model, _tokens(0), metric, **how)
    assert run.head_projections is not None  # the plain path runs on these models
    g = run.graph
    kinds: dict[str, list[int]] = {}
    for e in range(g.n_edges):
        kinds.setdefault(g.receivers[int(g.dst[e])].kind, []).append(e)
    gen = torch.Generator().manual_seed(1)
    edges = [e for k in sorted(kinds) for e in
             torch.tensor(kinds[k])[torch.randperm(len(kinds[k]), generator=gen)[:6]].tolist()]
    plain = run.exact(edges, batch_size=5)
    monkeypatch.setattr(plain_grads, "ENABLED", False)
    forks = run.exact(edges, batch_size=5)
    assert (plain - forks).abs().max() <= 1e-5 * max(1.0, float(forks.abs().max()))
    assert (forks - run.clean_value).abs().max() > 1e-6


def test_a_gradient_run_keeps_nothing_alive(llama_tiny):
    """run_coeffs(with_grad=True) leaves no run's autograd graph behind: its gradient hooks once
    held the hook object (and its writes), a cycle through autograd's nodes that kept every
    run's graph and gradients (about 90 MB a call on llama-tiny, 22 GB on a Gemma EAP-IG)."""
    import gc
    import weakref

    run = GraphRun(llama_tiny, _tokens(0), SinkScore(1), corrupted=_tokens(1))
    coeffs = torch.zeros(1, *run.graph.valid.shape, dtype=torch.float64)
    kept = []
    for _ in range(3):
        _, grads, _ = run.run_coeffs(coeffs, with_grad=True)
        assert grads
        kept += [weakref.ref(g) for g in grads.values()]
        del grads
    gc.collect()
    assert not [r for r in kept if r() is not None]
