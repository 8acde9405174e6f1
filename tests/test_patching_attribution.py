"""Attribution patching: one backward approximates the exact sweep; compare_to_exact reports it."""

from __future__ import annotations

import pytest

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
