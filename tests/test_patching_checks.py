"""Silent wrong answers patching used to give: a noise-sized normalisation span, a
TransformerLens-style call, a saturated bounded metric. Each must now fail loudly or warn."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.model import act_name, to_tokens
from mechsink.patching import Metric, Needs, SinkScore, activation_patch
from mechsink.patching import activation_patch as activation_patch_checked
from mechsink.patching import attribution_patch as attribution_patch_checked
from mechsink.patching import path_patch as path_patch_checked
from mechsink.patching.checks import SaturatedMetricWarning, check_normalizable

CLEAN = "When Mary and John went"
CORRUPTED = "When Tom and John went"


def _pair(model):
    return (to_tokens(model, CLEAN, prepend_bos=True),
            to_tokens(model, CORRUPTED, prepend_bos=True))


def one_plus_a_whisper(logits: torch.Tensor) -> torch.Tensor:
    """1 plus 1e-4 x the spread of the last logits (in float64, so the tiny gap between clean
    and corrupted survives): a value of size 1 that the two inputs move by ~1e-6 only, the
    way a saturated sink head's score does."""
    return 1.0 + 1e-4 * logits[:, -1].double().std()


def test_normalize_refuses_a_noise_sized_span(gpt2_tiny):
    clean, corrupted = _pair(gpt2_tiny)
    with torch.no_grad():
        a = one_plus_a_whisper(gpt2_tiny(clean))
        b = one_plus_a_whisper(gpt2_tiny(corrupted))
    gap, size = float((a - b).abs()), float(a.abs())
    assert 0 < gap < 1e-5 * size  # the premise: a real but noise-sized difference
    with pytest.raises(BadInputError, match="float noise"):
        activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", one_plus_a_whisper,
                         normalize=True)
    raw = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", one_plus_a_whisper)
    with pytest.raises(BadInputError, match="float noise"):
        raw.normalized()


def test_check_normalizable_is_relative_to_the_metrics_size():
    check_normalizable(1e-3, 0.0)  # small values, but a real gap
    check_normalizable(1000.0, 1000.1)
    with pytest.raises(BadInputError, match="float noise"):
        check_normalizable(1.0, 1.0 - 4.8e-7)
    with pytest.raises(BadInputError, match="float noise"):
        check_normalizable(1000.0, 1000.0 + 1e-3)
    check_normalizable(1.0, 0.95, dtype=torch.bfloat16)
    with pytest.raises(BadInputError, match="float noise"):
        check_normalizable(1.0, 0.995, dtype=torch.bfloat16)  # bfloat16 keeps ~2-3 digits
    with pytest.raises(BadInputError, match="no corrupted run"):
        check_normalizable(1.0, None)


def test_transformer_lens_style_call_is_named_before_any_forward(gpt2_tiny):
    # the functions as a user calls them: the tests' runtime type checker (jaxtyping's import
    # hook) would refuse these calls first, with a TypeCheckError a user never sees
    activation_patch = inspect.unwrap(activation_patch_checked)
    attribution_patch = inspect.unwrap(attribution_patch_checked)
    clean, corrupted = _pair(gpt2_tiny)
    calls = {"n": 0}

    def metric(logits):
        calls["n"] += 1
        return logits[0, -1, 0]

    with torch.no_grad():
        _, clean_cache = gpt2_tiny.run_with_cache(clean)
    # transformer_lens.patching's order: (model, corrupted_tokens, clean_cache, metric)
    with pytest.raises(BadInputError, match="ActivationCache.*signature is activation_patch"):
        activation_patch(gpt2_tiny, corrupted, clean_cache, "resid_pre", metric)
    with pytest.raises(BadInputError, match="ActivationCache"):
        activation_patch(gpt2_tiny, corrupted, clean_cache, metric, "resid_pre")
    with pytest.raises(BadInputError, match="dict"):
        activation_patch(gpt2_tiny, clean, dict(clean_cache.items()), "resid_pre", metric)
    with pytest.raises(BadInputError, match="site comes before the metric"):
        activation_patch(gpt2_tiny, clean, corrupted, metric, "resid_pre")
    with pytest.raises(BadInputError, match="torch.float32 tensor"):
        activation_patch(gpt2_tiny, clean, clean_cache[act_name("resid_pre", 0)],
                         "resid_pre", metric)
    with pytest.raises(BadInputError, match="list holding int"):
        activation_patch(gpt2_tiny, [1, 2, 3], corrupted, "resid_pre", metric)
    with pytest.raises(BadInputError, match="ActivationCache"):
        attribution_patch(gpt2_tiny, corrupted, clean_cache, "resid_pre", metric)
    path_patch = inspect.unwrap(path_patch_checked)
    with pytest.raises(BadInputError, match="ActivationCache.*signature is path_patch"):
        path_patch(gpt2_tiny, corrupted, clean_cache, ["L0H0"], ["resid1"], metric,
                   prepend_bos=True)
    assert calls["n"] == 0


class NearOne(Metric):
    """A metric bounded in [0, 1] that sits within 1e-4 of 1 (a saturated sink head's score),
    moving by a hair with the last logit."""

    name = "near_one"
    bounds = (0.0, 1.0)

    def needs(self, model):
        return Needs(logits=(-1,))

    def __call__(self, out):
        return 1.0 - 1e-5 * torch.sigmoid(out.logits_at(-1)[:, 0]).mean()


def test_every_site_name_form_passes_the_entry_check(gpt2_tiny):
    """A get_act_name pair and a parsed Name are site names too (the check refused them)."""
    from mechsink.names import parse_name
    from mechsink.patching import LogitDiff

    clean, corrupted = _pair(gpt2_tiny)
    ref = activation_patch(gpt2_tiny, clean, corrupted, "blocks.1.attn.hook_z", LogitDiff(1, 2))
    for form in [("z", 1), parse_name("blocks.1.attn.hook_z")]:
        got = activation_patch(gpt2_tiny, clean, corrupted, form, LogitDiff(1, 2))
        assert torch.equal(got.values, ref.values)


def test_saturated_bounded_metric_warns(gpt2_tiny):
    clean, corrupted = _pair(gpt2_tiny)
    with pytest.warns(SaturatedMetricWarning, match="within 0.001 of its bound 1"):
        activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", NearOne())
    assert SinkScore(0).bounds == (0.0, 1.0)


def test_unsaturated_metric_does_not_warn(gpt2_tiny):
    clean, corrupted = _pair(gpt2_tiny)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SaturatedMetricWarning)
        res = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", SinkScore(1),
                               normalize=True)
    assert res.meta["normalized"]


@pytest.mark.slow
def test_saturated_sink_head_on_smollm2(smollm2):
    """SmolLM2's head 18.8 puts ~0.99998 of its attention on BOS on both prompts: the sweep
    warns, and normalising refuses (the gap is ~1e-5 of the score)."""
    from mechsink.measure.sinks import sink_score

    clean = to_tokens(smollm2, "When Mary and John went to the store, John gave a drink to",
                      prepend_bos=True)
    corrupted = to_tokens(smollm2, "When Mary and John went to the store, Mary gave a drink to",
                          prepend_bos=True)
    with torch.no_grad():
        _, a = smollm2.run_with_cache(clean, names_filter=act_name("pattern", 18))
        _, b = smollm2.run_with_cache(corrupted, names_filter=act_name("pattern", 18))
    sa = float(sink_score(a[act_name("pattern", 18)], 0)[0, 8])
    sb = float(sink_score(b[act_name("pattern", 18)], 0)[0, 8])
    assert sa > 0.999 and sb > 0.999  # independent of SinkScore: the premise holds
    metric = SinkScore(18, 8)
    with pytest.warns(SaturatedMetricWarning), pytest.raises(BadInputError, match="float noise"):
        activation_patch(smollm2, clean, corrupted, "attn_out", metric, normalize=True)


def test_frozen_scales_do_not_leak_transformer_lens_hook_scale_warning(llama_tiny):
    """RMSNorm models take TransformerLens's native-autograd norm path, which warns whenever a
    hook edits hook_scale; freezing scales is such an edit, on purpose."""
    from mechsink.patching import LogitDiff, path_patch

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        path_patch(llama_tiny, CLEAN, CORRUPTED, ["L0H0", "MLP0"], ["resid1"],
                   LogitDiff(100, 200), scales="frozen", prepend_bos=True)
    assert not [w for w in seen if "hook_scale" in str(w.message)]
