"""Head-wise RMSNorm: unit RMS per head before the gain, hookable, saved and loaded intact."""

from __future__ import annotations

import pytest
import torch

from mechsink import load_model, save_organism
from mechsink.model import hf_model_of, to_tokens, wrap_hf
from mechsink.model.variants import HeadwiseRMSNormOut, apply_headwise_rmsnorm
from mechsink.model.zoo import random_hf_model
from mechsink.training.loop import get_recipe

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


# --- attention variants ------------------------------------------------------------------------

from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv  # noqa: E402

from mechsink.model.variants import (  # noqa: E402
    ATTENTION_VARIANTS,
    AttentionVariantOut,
    apply_attention_variant,
    sink_pattern,
)

TOKENS = torch.tensor([[50256, 464, 3290, 318, 257, 1332, 13]])


def _llama(kind=None, seed=0):
    hf, tok = random_hf_model("llama-tiny", seed=seed)
    if kind is not None:
        apply_attention_variant(hf, kind)
    return hf, tok


def _variant_modules(hf):
    mods = [layer.self_attn.o_proj for layer in hf.model.layers]
    assert all(isinstance(m, AttentionVariantOut) for m in mods)
    return mods


def _hand_scores(hf, layer, tokens):
    """Layer ``layer``'s scaled causal logits from plain transformers activations (no mechsink)."""
    seen = {}
    attn = hf.model.layers[layer].self_attn
    handle = attn.register_forward_pre_hook(lambda m, a, kw: seen.update(kw), with_kwargs=True)
    try:
        with torch.no_grad():
            hf(tokens)
    finally:
        handle.remove()
    x = seen["hidden_states"]
    shape = (*x.shape[:-1], -1, attn.head_dim)
    q = attn.q_proj(x).view(shape).transpose(1, 2)
    k = attn.k_proj(x).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, *seen["position_embeddings"])
    k = repeat_kv(k, attn.num_key_value_groups)
    s = (q @ k.transpose(2, 3)) * attn.scaling
    t = s.shape[-1]
    return s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf")), x, q


def _bridge_pattern(hf, tok, layer=0):
    bridge = wrap_hf(hf, tok, name="variant")
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(TOKENS)
    return bridge, logits, cache[f"blocks.{layer}.attn.hook_pattern"]


@pytest.mark.parametrize("kind", ATTENTION_VARIANTS)
def test_variant_bridge_matches_transformers_and_round_trips(kind, tmp_path):
    hf, tok = _llama(kind)
    with torch.no_grad():
        for m in _variant_modules(hf):
            for p in m.parameters(recurse=False):
                p.normal_(0.0, 1.0)  # trained-looking variant parameters
        reference = hf(TOKENS).logits
    bridge, logits, pattern = _bridge_pattern(hf, tok)
    torch.testing.assert_close(logits, reference)  # hooks see the variant, not a softmax
    folder = save_organism(bridge, tmp_path / "org")
    again = load_model(f"organism:{folder}", device="cpu")
    with torch.no_grad():
        torch.testing.assert_close(again(TOKENS), reference)
    layers = hf_model_of(again).model.layers
    assert [layer.self_attn.mechsink_variant for layer in layers] == [kind] * len(layers)
    assert hf_model_of(again).config.mechsink_variants == [kind]


def test_softmax1_matches_hand_computation():
    hf, tok = _llama("softmax1")
    scores, _, _ = _hand_scores(hf, 0, TOKENS)
    e = scores.exp()
    _, _, pattern = _bridge_pattern(hf, tok)
    torch.testing.assert_close(pattern, e / (1 + e.sum(-1, keepdim=True)))
    assert (pattern.sum(-1) < 1).all()


def test_sink_logit_reduces_to_softmax_when_very_negative():
    hf, tok = _llama("sink_logit")
    plain, _ = _llama(None)
    with torch.no_grad():
        for m in _variant_modules(hf):
            m.sink_logit.fill_(-1e4)
        torch.testing.assert_close(hf(TOKENS).logits, plain(TOKENS).logits)
        for m in _variant_modules(hf):
            m.sink_logit.copy_(torch.tensor([0.0, 1.0, -1.0, 2.0])[: m.n_heads])
    scores, _, _ = _hand_scores(hf, 0, TOKENS)
    b = _variant_modules(hf)[0].sink_logit.view(1, -1, 1, 1)
    expected = scores.exp() / (scores.exp().sum(-1, keepdim=True) + b.exp())
    torch.testing.assert_close(_bridge_pattern(hf, tok)[2], expected)


def test_gate_reduces_to_softmax_when_open_and_matches_hand_gate():
    hf, tok = _llama("gated")
    plain, _ = _llama(None)
    with torch.no_grad():
        for m in _variant_modules(hf):
            m.gate.weight.zero_()
            m.gate.bias.fill_(40.0)  # sigmoid(40) == 1 in float32
        torch.testing.assert_close(hf(TOKENS).logits, plain(TOKENS).logits)
        gate = _variant_modules(hf)[0].gate
        gate.weight.normal_(0, 0.5)
        gate.bias.zero_()
    bridge = wrap_hf(hf, tok, name="gated")
    with torch.no_grad():
        _, cache = bridge.run_with_cache(TOKENS)
    _, x, _ = _hand_scores(hf, 0, TOKENS)
    z = cache["blocks.0.attn.hook_z"].flatten(-2)  # before the gate
    w, b = gate.weight, gate.bias
    expected = (z * torch.sigmoid(x @ w.T + b)) @ hf.model.layers[0].self_attn.o_proj.proj.weight.T
    torch.testing.assert_close(cache["blocks.0.hook_attn_out"], expected)


def test_softpick_matches_hand_computation():
    hf, tok = _llama("softpick")
    scores, _, _ = _hand_scores(hf, 0, TOKENS)
    e = scores.exp() - 1  # -1 where masked: those terms are left out of the sum
    visible = torch.isfinite(scores)
    expected = e.clamp(min=0) / (e.abs().where(visible, 0.0).sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(_bridge_pattern(hf, tok)[2], expected, atol=1e-6, rtol=1e-4)
    # on a tiny input written out: logits 1, 0, -1 -> (e - 1, 0, 0) / ((e - 1) + 0 + (1 - 1/e))
    from mechsink.model.variants import softpick

    got = softpick(torch.tensor([1.0, 0.0, -1.0]))
    e1 = torch.e - 1
    torch.testing.assert_close(got, torch.tensor([e1 / (e1 + 1 - 1 / torch.e), 0.0, 0.0]),
                               atol=1e-5, rtol=1e-5)


def test_sigmoid_is_unnormalised_and_its_sink_score_is_output_share():
    hf, tok = _llama("sigmoid")
    scores, _, _ = _hand_scores(hf, 0, TOKENS)
    _, _, pattern = _bridge_pattern(hf, tok)
    torch.testing.assert_close(pattern, torch.sigmoid(scores))
    assert pattern.sum(-1)[0, 0, -1] > 2  # 7 keys at about 0.5 each: no normalisation
    share = sink_pattern(pattern, "sigmoid")
    torch.testing.assert_close(share[..., 0], pattern[..., 0] / pattern.sum(-1))
    assert sink_pattern(pattern, "softmax1") is pattern


def test_kv_bias_slot_matches_hand_computation_and_zero_slot_is_softmax1():
    hf, tok = _llama("kv_bias")
    one, _ = _llama("softmax1")
    with torch.no_grad():
        for m in _variant_modules(hf):
            m.k_bias.zero_()
            m.v_bias.zero_()
        torch.testing.assert_close(hf(TOKENS).logits, one(TOKENS).logits)
        for m in _variant_modules(hf):
            m.k_bias.normal_(0, 1.0)
            m.v_bias.normal_(0, 1.0)
    mod = _variant_modules(hf)[0]
    scores, _, _ = _hand_scores(hf, 0, TOKENS)
    attn = hf.model.layers[0].self_attn
    seen = {}
    handle = attn.q_proj.register_forward_hook(lambda m, a, out: seen.update(q=out))
    bridge = wrap_hf(hf, tok, name="kv")
    try:
        with torch.no_grad():
            _, cache = bridge.run_with_cache(TOKENS)
    finally:
        handle.remove()
    q = seen["q"].unflatten(-1, (mod.n_heads, mod.d_head))  # un-rotated queries
    slot = torch.einsum("bqhd,hd->bhq", q, mod.k_bias)[..., None] * attn.scaling
    full = torch.cat([scores, slot], -1).softmax(-1)
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"], full[..., :-1])
    z = cache["blocks.0.attn.hook_z"]  # b q h d, without the slot's value
    z_full = z + full[..., -1].transpose(1, 2)[..., None] * mod.v_bias
    torch.testing.assert_close(cache["blocks.0.hook_attn_out"],
                               z_full.flatten(-2) @ mod.proj.weight.T)


def test_variant_recipes_and_bad_options():
    from mechsink.errors import BadInputError

    assert get_recipe("bb-llama-tiny+softpick").attention == "softpick"
    assert get_recipe("bb-llama-tiny").attention == "softmax"
    with pytest.raises(BadInputError, match="llama recipe"):
        get_recipe("bb-gpt2-tiny+sigmoid")
    with pytest.raises(BadInputError, match="unknown recipe option"):
        get_recipe("bb-llama-tiny+nope")
    with pytest.raises(BadInputError, match="do not combine"):
        get_recipe("bb-llama-tiny+hwrms+gated")
