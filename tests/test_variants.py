"""Head-wise RMSNorm: unit RMS per head before the gain, hookable, saved and loaded intact."""

from __future__ import annotations

import pytest
import torch

from mechsink import load_model, save_organism
from mechsink.bridge import hf_model_of, to_tokens, wrap_hf
from mechsink.training import get_recipe
from mechsink.variants import HeadwiseRMSNormOut, apply_headwise_rmsnorm
from mechsink.zoo import random_hf_model

TEXT = "Head-wise RMSNorm restores statistical parity across positions."


@pytest.fixture(params=["llama-tiny", "gpt2-tiny"])
def hwrms_model(request):
    hf, tok = random_hf_model(request.param, seed=0)
    apply_headwise_rmsnorm(hf)
    with torch.no_grad():
        for module in hf.modules():
            if isinstance(module, HeadwiseRMSNormOut):
                module.gain.normal_(1.0, 0.5)  # a trained-looking gain, not all ones
    return wrap_hf(hf, tok, name=f"random:{request.param}+hwrms")


def _norm_modules(model):
    return [m for m in hf_model_of(model).modules() if isinstance(m, HeadwiseRMSNormOut)]


def test_unit_rms_per_head_before_the_gain(hwrms_model):
    tokens = to_tokens(hwrms_model, TEXT, prepend_bos=True)
    _, cache = hwrms_model.run_with_cache(tokens)
    for layer, module in enumerate(_norm_modules(hwrms_model)):
        z = cache[f"blocks.{layer}.attn.hook_z"]  # before the norm
        normed = module.normalise(z.flatten(-2))
        rms = normed.pow(2).mean(-1).sqrt()
        mean_square = z.pow(2).mean(-1)
        # unit RMS up to the epsilon inside the square root
        torch.testing.assert_close(rms, (mean_square / (mean_square + module.eps)).sqrt())
        assert (rms - 1).abs().max() < 5e-3
        assert (mean_square.sqrt() - 1).abs().min() > 0.5  # z itself is far from unit RMS


def test_attention_output_is_the_projected_normalised_z(hwrms_model):
    tokens = to_tokens(hwrms_model, TEXT, prepend_bos=True)
    _, cache = hwrms_model.run_with_cache(tokens)
    for layer, module in enumerate(_norm_modules(hwrms_model)):
        z = cache[f"blocks.{layer}.attn.hook_z"].flatten(-2)
        expected = module.proj((module.normalise(z) * module.gain).flatten(-2))
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_attn_out"], expected)


def test_organism_with_the_variant_round_trips(tmp_path, hwrms_model):
    folder = save_organism(hwrms_model, tmp_path / "org")
    again = load_model(f"organism:{folder}", device="cpu")
    assert len(_norm_modules(again)) == hwrms_model.cfg.n_layers
    tokens = to_tokens(hwrms_model, TEXT, prepend_bos=True)
    with torch.no_grad():
        assert torch.equal(again(tokens), hwrms_model(tokens))


def test_recipe_suffix_turns_the_variant_on():
    assert get_recipe("bb-llama-tiny+hwrms").headwise_rmsnorm
    assert not get_recipe("bb-llama-tiny").headwise_rmsnorm
