"""The query-bias split sums to the model's own attention scores."""

from __future__ import annotations

import torch

from mechsink.measure.query_bias import split_attention_logits
from mechsink.model import to_tokens, wrap_hf
from mechsink.model.zoo import random_hf_model


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
    from mechsink.measure.query_bias import delta_attribution, residual_components
    from mechsink.model import norm_params

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


def _scores(model, tokens, layer, edits=()):
    from mechsink.interventions.edits import applied

    with applied(model, list(edits)), torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=[
            f"blocks.{layer}.attn.hook_attn_scores"])
    return cache[f"blocks.{layer}.attn.hook_attn_scores"].double()


def _llama_with_biases():
    """A tiny Llama (rotary positions, GQA) with learned q/k/v biases set to real values."""
    from mechsink.model.zoo import random_config, seeded_model

    config = random_config("llama-tiny")
    config.attention_bias = True
    hf = seeded_model(config, seed=0).eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    _, tok = random_hf_model("llama-tiny", seed=0)
    return wrap_hf(hf, tok, name="random:llama-tiny+biases")


def test_bias_split_matches_the_scores_with_each_bias_removed():
    """Under rotary positions (GQA), each bilinear part equals a difference of the model's own
    attention scores with the query bias, the key bias or both removed."""
    from mechsink.interventions.edits import remove_key_bias, remove_query_bias
    from mechsink.measure.query_bias import bias_logit_split

    model = _llama_with_biases()
    tokens = to_tokens(model, "Rotary keys carry their bias around with them.",
                       prepend_bos=True)
    causal = torch.ones(tokens.shape[1], tokens.shape[1]).tril().bool()
    for layer in range(model.cfg.n_layers):
        parts = bias_logit_split(model, tokens, layer).parts
        full = _scores(model, tokens, layer)
        no_q = _scores(model, tokens, layer, [remove_query_bias(model, layer)])
        no_k = _scores(model, tokens, layer, [remove_key_bias(model, layer)])
        none = _scores(model, tokens, layer, [remove_query_bias(model, layer),
                                              remove_key_bias(model, layer)])

        def close(a, b):
            torch.testing.assert_close(a[..., causal], b[..., causal], atol=1e-5, rtol=1e-5)

        close(parts["content"], none)
        close(parts["query bias"] + parts["both biases"], full - no_q)
        close(parts["key bias"] + parts["both biases"], full - no_k)
        assert parts["key bias"][..., causal].std() > 1e-3  # really there, and position-dependent


def test_bias_split_query_part_is_delta_on_gpt2():
    """Without rotation the query-bias part is Delta_j = b_Q . (x_j W_K) / sqrt(d_head)."""
    from mechsink.measure.query_bias import bias_logit_split

    hf, tok = random_hf_model("gpt2-tiny", seed=0)
    with torch.no_grad():
        for block in hf.transformer.h:
            block.attn.c_attn.bias.normal_(0.0, 0.5)
    model = wrap_hf(hf, tok, name="random:gpt2-tiny+biases")
    tokens = to_tokens(model, "The sink comes from the query bias, they say.", prepend_bos=True)
    _, cache = model.run_with_cache(tokens)
    t = tokens.shape[1]
    for layer in range(model.cfg.n_layers):
        split = split_attention_logits(
            cache[f"blocks.{layer}.ln1.hook_out"], model.W_Q[layer], model.b_Q[layer],
            model.W_K[layer], model.b_K[layer])
        part = bias_logit_split(model, tokens, layer).parts["query bias"]
        torch.testing.assert_close(part.float(), split.delta[:, :, None, :].expand(-1, -1, t, -1),
                                   atol=1e-5, rtol=1e-5)
