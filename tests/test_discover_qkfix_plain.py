"""AtP*'s QK fix without per-head forks: the patched patterns computed with the projected change
added at attn.hook_q/k equal graph mode's per-head input copies (TransformerLens's
use_split_qkv_input), on every query and key edge."""

from __future__ import annotations

import pytest
import torch

from mechsink.discover import GraphRun, plain_grads
from mechsink.discover.qkfix import _patched_patterns, qk_fixed
from mechsink.discover.scores import clean_gradients
from mechsink.inputs.prompts import make_prompts
from mechsink.patching import LogitDiff, SinkScore


@pytest.mark.parametrize("which, metric, corruption", [
    ("llama_tiny", SinkScore(1), {"ablation": "position_mean", "positions": [0]}),
    ("llama_tiny", LogitDiff(11, 12), "counterfactual"),
    ("gpt2_tiny", LogitDiff(11, 12), "counterfactual"),
    ("gpt2_tiny", SinkScore(1), {"ablation": "zero", "positions": None}),
])
def test_plain_qk_fix_equals_graph_mode(request, monkeypatch, which, metric, corruption):
    model = request.getfixturevalue(which)
    tokens = make_prompts(model, "natural", "bos", n=3, seq_len=7).tokens
    if corruption == "counterfactual":
        kw = {"corrupted": tokens.roll(1, 0)}
    else:
        kw = corruption
    run = GraphRun(model, tokens, metric, **kw)
    assert run.head_projections is not None  # the plain path is the one under test
    grads = clean_gradients(run)
    values = torch.zeros(run.graph.n_edges, dtype=torch.float64)
    plain = qk_fixed(run, values, grads)
    plain_p = _patched_patterns(run, 1, "k", list(range(5)))
    monkeypatch.setattr(plain_grads, "ENABLED", False)
    forked = qk_fixed(run, values, grads)
    forked_p = _patched_patterns(run, 1, "k", list(range(5)))
    torch.testing.assert_close(plain_p, forked_p, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(plain, forked, rtol=1e-5, atol=1e-7)
    assert plain.abs().max() > 0


def test_query_edges_move_no_pattern_when_only_position_0_is_corrupted(llama_tiny):
    """The shortcut qk_fixed takes: query 0 attends to key 0 alone, so changing it (the only
    query a position-0 corruption moves) leaves every pattern as it was."""
    tokens = make_prompts(llama_tiny, "natural", "bos", n=3, seq_len=7).tokens
    run = GraphRun(llama_tiny, tokens, LogitDiff(11, 12), ablation="zero", positions=[0])
    for layer in range(run.graph.n_layers):
        n_s = run.graph.n_senders_before(next(r for r in run.graph.receivers
                                              if r.kind == "q" and r.layer == layer))
        moved = _patched_patterns(run, layer, "q", list(range(n_s)))
        base = run.clean.acts[f"blocks.{layer}.attn.hook_pattern"]
        torch.testing.assert_close(moved, base.expand_as(moved), rtol=0, atol=1e-6)
        assert (_patched_patterns(run, layer, "k", list(range(n_s))) - base).abs().max() > 1e-4


@pytest.mark.parametrize("which", ["llama_tiny", "gpt2_tiny"])
def test_key_edges_in_closed_form_equal_the_patched_layer(request, which):
    """Only position 0 corrupted: the key edges' change of pattern computed from the moved
    logit of key 0 alone equals running the attention layer with the edge patched."""
    from mechsink.discover.qkfix import _Key0, _pattern_scores

    model = request.getfixturevalue(which)
    tokens = make_prompts(model, "natural", "bos", n=3, seq_len=7).tokens
    run = GraphRun(model, tokens, LogitDiff(11, 12), ablation="position_mean", positions=[0])
    grads = clean_gradients(run)
    key0 = _Key0(run)
    for layer in range(run.graph.n_layers):
        assert key0.holds(layer)  # every premise checked on the clean run
        n_s = run.graph.n_senders_before(next(r for r in run.graph.receivers
                                              if r.kind == "k" and r.layer == layer))
        base = run.clean.acts[f"blocks.{layer}.attn.hook_pattern"]
        grad = grads[f"blocks.{layer}.attn.hook_pattern"]
        closed = key0.scores(layer, n_s, base, grad)
        ran = _pattern_scores(run, layer, "k", n_s, base, grad)
        torch.testing.assert_close(closed, ran, rtol=1e-4, atol=1e-7)
        assert ran.abs().max() > 0
