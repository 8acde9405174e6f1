"""Attribution patching: one backward approximates the exact sweep; compare_to_exact reports it."""

from __future__ import annotations

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.model import to_tokens
from mechsink.patching import LogitDiff, SinkScore, activation_patch
from mechsink.patching.attribution import attribution_patch, compare_to_exact

CLEAN = "When Mary and John went"
CORRUPTED = "When Tom and John went"


@pytest.mark.parametrize("site", ["resid_pre", "z", "v_all_pos"])
def test_attribution_tracks_exact_on_logit_metric(llama_tiny, site):
    clean = to_tokens(llama_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(llama_tiny, CORRUPTED, prepend_bos=True)
    approx = attribution_patch(llama_tiny, clean, corrupted, site, LogitDiff(100, 200))
    exact = activation_patch(llama_tiny, clean, corrupted, site, LogitDiff(100, 200))
    report = compare_to_exact(approx, exact, top=3)
    assert report["pearson"] > 0.9
    assert len(report["worst"]) == 3 and set(exact.axes) <= set(report["worst"][0])
    # the worst error is reported, not hidden: it is the largest gap between the two sweeps
    gap = (approx.values - exact.values).abs().max().item()
    assert report["max_abs_error"] == pytest.approx(gap, rel=1e-9, abs=1e-12)
    assert report["worst"][0]["error"] == pytest.approx(gap, rel=1e-9, abs=1e-12)


def test_attribution_runs_on_sink_metric_and_leaves_no_hooks(gpt2_tiny):
    clean = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(gpt2_tiny, CORRUPTED, prepend_bos=True)
    approx = attribution_patch(gpt2_tiny, clean, corrupted, "resid_pre", SinkScore(1))
    assert approx.values.shape == (2, 6)
    assert all(not hp.fwd_hooks and not hp.bwd_hooks for hp in gpt2_tiny.hook_dict.values())


def test_compare_rejects_different_layouts(gpt2_tiny):
    clean = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(gpt2_tiny, CORRUPTED, prepend_bos=True)
    a = attribution_patch(gpt2_tiny, clean, corrupted, "resid_pre", LogitDiff(100, 200))
    b = activation_patch(gpt2_tiny, clean, corrupted, "z_all_pos", LogitDiff(100, 200))
    with pytest.raises(BadInputError, match="layout"):
        compare_to_exact(a, b)


def test_attribution_equals_a_gradient_written_with_transformer_lens_hooks(llama_tiny):
    """The estimate per head (z, all positions, denoising): m(corrupted) + (z_clean -
    z_corrupted) . dm/dz at the corrupted run, the gradient taken here with plain
    run_with_hooks and autograd."""
    clean = to_tokens(llama_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(llama_tiny, CORRUPTED, prepend_bos=True)
    n_layers, n_heads = llama_tiny.cfg.n_layers, llama_tiny.cfg.n_heads
    names = [f"blocks.{layer}.attn.hook_z" for layer in range(n_layers)]
    with torch.no_grad():
        _, cache = llama_tiny.run_with_cache(clean, names_filter=lambda n: n in names)
    probes: dict[str, torch.Tensor] = {}
    seen: dict[str, torch.Tensor] = {}

    def probe(act, hook):
        seen[hook.name] = act.detach().clone()
        probes[hook.name] = torch.zeros_like(act, requires_grad=True)
        return act + probes[hook.name]

    with torch.enable_grad():
        logits = llama_tiny.run_with_hooks(corrupted, fwd_hooks=[(n, probe) for n in names])
        value = (logits[:, -1, 100] - logits[:, -1, 200]).mean()
        grads = torch.autograd.grad(value, [probes[n] for n in names])
    expected = torch.empty(n_layers, n_heads, dtype=torch.float64)
    for layer, (name, grad) in enumerate(zip(names, grads, strict=True)):
        per_head = ((cache[name] - seen[name]) * grad).sum((0, 1, 3))
        expected[layer] = float(value.detach()) + per_head.double()
    got = attribution_patch(llama_tiny, clean, corrupted, "z_all_pos", LogitDiff(100, 200))
    torch.testing.assert_close(got.values, expected, atol=1e-5, rtol=1e-5)


def test_a_list_of_metrics_gives_one_result_per_metric(llama_tiny):
    """activation_patch and attribution_patch took a list and silently used its first metric:
    each metric now gets its own result, equal to patching with that metric alone."""
    clean = to_tokens(llama_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(llama_tiny, CORRUPTED, prepend_bos=True)
    metrics = [LogitDiff(100, 200), SinkScore(1), LogitDiff(7, 9)]
    for fn in (activation_patch, attribution_patch):
        many = fn(llama_tiny, clean, corrupted, "z", metrics)
        assert isinstance(many, list) and len(many) == len(metrics)
        for m, res in zip(metrics, many, strict=True):
            alone = fn(llama_tiny, clean, corrupted, "z", m)
            assert res.metric == m.name
            assert res.clean_value == pytest.approx(alone.clean_value, abs=1e-6)
            torch.testing.assert_close(res.values, alone.values, atol=1e-6, rtol=1e-6)
        assert not torch.allclose(many[0].values, many[2].values)
    raw = activation_patch(llama_tiny, clean, corrupted, "resid_pre", metrics[::2])
    normalized = activation_patch(llama_tiny, clean, corrupted, "resid_pre", metrics[::2],
                                  normalize=True)
    for r, n in zip(raw, normalized, strict=True):
        assert n.is_normalized
        span = r.clean_value - r.corrupted_value
        torch.testing.assert_close(n.values, (r.values - r.corrupted_value) / span)
