"""Receiver gradients from a plain forward/backward (#26 item 2) against graph mode's own
per-head forks (1e-5): at the clean run (EAP, the QK fix's pattern gradients) and at shifted
inputs (EAP-IG's steps), on RMSNorm and LayerNorm models, GQA and a learned query bias; and
the graph-mode fallback where a premise fails."""

from __future__ import annotations

import pytest
import torch

from mechsink.discover import GraphRun, eap, eap_ig, plain_grads
from mechsink.discover import scores as sc
from mechsink.patching import KLToClean, LogitDiff, MassiveValue, SinkScore


def _tokens(seed: int, batch: int = 3, seq: int = 7) -> torch.Tensor:
    t = torch.randint(5, 500, (batch, seq), generator=torch.Generator().manual_seed(seed))
    t[:, 0] = 1
    return t


CASES = [
    ("llama_tiny", SinkScore(1), {"corrupted": _tokens(1)}),
    ("llama_tiny", LogitDiff(11, 12), {"corrupted": _tokens(1)}),
    ("llama_tiny", MassiveValue(1, 0, 3), {"ablation": "position_mean", "positions": [0]}),
    ("gpt2_tiny", KLToClean(-1), {"corrupted": _tokens(1)}),
    ("gpt2_tiny", SinkScore(1), {"ablation": "zero", "positions": [0, 3]}),
]


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    scale = max(1.0, float(b.abs().max()))
    assert float((a - b).abs().max()) <= 1e-5 * scale


@pytest.mark.parametrize("fixture, metric, how", CASES)
def test_plain_gradients_equal_graph_mode(request, fixture, metric, how):
    model = request.getfixturevalue(fixture)
    run = GraphRun(model, _tokens(0), metric, **how)
    g = run.graph
    layers = list(range(g.n_layers)) + ([g.point.layer] if g.point.kind == "attn" else [])
    zeros = torch.zeros(2, len(g.senders), len(g.receivers))
    _, ref, _ = run.run_coeffs(zeros, with_grad=True, pattern_layers=layers,
                               embed_shift=torch.tensor([0.0, 0.7]))
    got = plain_grads.receiver_grads(run, [0.0, 0.7], layers)
    assert got is not None and set(got) == set(ref)
    for name in ref:
        _close(got[name], ref[name])


@pytest.mark.parametrize("fixture, metric, how", CASES[1:4])
def test_methods_equal_their_graph_mode_scores(request, monkeypatch, fixture, metric, how):
    model = request.getfixturevalue(fixture)
    run = GraphRun(model, _tokens(0), metric, **how)
    fast = [eap(run, qk_fix=True, verify=0).values,
            eap_ig(run, steps=3, qk_fix=False, verify=0).values]
    monkeypatch.setattr(plain_grads, "ENABLED", False)
    slow = [eap(run, qk_fix=True, verify=0).values,
            eap_ig(run, steps=3, qk_fix=False, verify=0).values]
    for a, b in zip(fast, slow, strict=True):
        _close(a, b)


def test_a_failed_premise_falls_back(llama_tiny, monkeypatch):
    """A query projection that is not what hook_q holds (here: the check's weights doubled)
    is caught and the caller gets None (graph mode)."""
    run = GraphRun(llama_tiny, _tokens(0), SinkScore(1), corrupted=_tokens(1))
    real = plain_grads.head_weights
    monkeypatch.setattr(plain_grads, "head_weights",
                        lambda model, kind: 2 * real(model, kind) if kind == "q" else
                        real(model, kind))
    assert plain_grads.receiver_grads(run, [0.0]) is None
    grads = sc.clean_gradients(run)  # and the method still works, through graph mode
    assert grads
    # exact edges: the same check refuses the plain path, the per-head copies run instead
    assert run.head_projections is None
    assert torch.isfinite(run.exact([0, run.graph.n_edges - 1])).all()


@pytest.mark.slow
def test_plain_gradients_on_smollm2(smollm2):
    """The premises hold on the real SmolLM2 (GQA, RMSNorm with a gain, massive activations at
    position 0) and the gradients equal graph mode's: 2 prompts x 8 tokens, a channel of
    block 3's output as the metric."""
    tokens = torch.randint(5, 40000, (2, 8), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 1
    run = GraphRun(smollm2, tokens, MassiveValue(3, 0, 7), ablation="zero", positions=[0])
    g = run.graph
    zeros = torch.zeros(1, len(g.senders), len(g.receivers))
    _, ref, _ = run.run_coeffs(zeros, with_grad=True, embed_shift=torch.tensor([0.5]))
    got = plain_grads.receiver_grads(run, [0.5])
    assert got is not None and set(got) == set(ref)
    for name in ref:
        _close(got[name], ref[name])
