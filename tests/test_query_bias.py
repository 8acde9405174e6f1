"""The query-bias split sums to the model's own attention scores."""

from __future__ import annotations

import torch

from mechsink.bridge import to_tokens, wrap_hf
from mechsink.query_bias import split_attention_logits
from mechsink.zoo import random_hf_model


def test_split_sums_to_the_real_attention_scores():
    hf, tok = random_hf_model("gpt2-tiny", seed=0)
    with torch.no_grad():  # random init has zero biases: give b_Q, b_K, b_V real values
        for block in hf.transformer.h:
            block.attn.c_attn.bias.normal_(0.0, 0.5)
    model = wrap_hf(hf, tok, name="random:gpt2-tiny+biases")
    tokens = to_tokens(model, "The sink comes from the query bias, they say.", prepend_bos=True)
    _, cache = model.run_with_cache(tokens)
    causal = torch.ones(tokens.shape[1], tokens.shape[1]).tril().bool()
    for layer in range(model.cfg.n_layers):
        split = split_attention_logits(
            cache[f"blocks.{layer}.ln1.hook_out"], model.W_Q[layer], model.b_Q[layer],
            model.W_K[layer], model.b_K[layer],
        )
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"]
        torch.testing.assert_close(split.total()[..., causal], scores[..., causal],
                                   atol=1e-5, rtol=1e-5)
        assert split.delta.abs().max() > 1e-2  # the query-bias term is really there


def test_delta_attribution_sums_to_delta():
    from mechsink.bridge import norm_params
    from mechsink.query_bias import delta_attribution, residual_components

    hf, tok = random_hf_model("gpt2-tiny", seed=1)
    with torch.no_grad():
        for block in hf.transformer.h:
            block.attn.c_attn.bias.normal_(0.0, 0.5)
            block.ln_1.bias.normal_(0.0, 0.3)
    model = wrap_hf(hf, tok, name="random:gpt2-tiny+biases")
    tokens = to_tokens(model, "Position zero carries the sink in GPT-2.", prepend_bos=True)
    _, cache = model.run_with_cache(tokens)
    layer = 1
    w, b = norm_params(model, layer)
    parts = delta_attribution(residual_components(cache, layer),
                              cache[f"blocks.{layer}.ln1.hook_scale"], w, b,
                              model.W_K[layer], model.b_Q[layer])
    assert set(parts) >= {"token embedding", "position embedding", "mlp 0 out", "LayerNorm bias"}
    split = split_attention_logits(cache[f"blocks.{layer}.ln1.hook_out"], model.W_Q[layer],
                                   model.b_Q[layer], model.W_K[layer], model.b_K[layer])
    torch.testing.assert_close(sum(parts.values()), split.delta[:, :, 0], atol=1e-5, rtol=1e-5)
