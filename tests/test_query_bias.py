"""The query-bias split sums to the model's own attention scores."""

from __future__ import annotations

import pytest
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


# --- grouped-query attention with key biases: one KV head's bias serves a group of queries -------


def _qwen2_hf():
    """A tiny Qwen2 (rotary positions, 4 query heads sharing 2 KV heads, learned q/k/v biases
    set to real values), built with transformers."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, vocab_size=50257,
                         max_position_embeddings=64)
    hf = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    return hf


def _as_hooked_transformer(hf, tokenizer):
    """The same weights as a HookedTransformer (TransformerLens 2/3; 4 has none), by
    TransformerLens's own Qwen2 weight conversion, raw and unfolded."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError:
        pytest.skip("this TransformerLens has no HookedTransformer (TransformerLens 4)")
    from transformer_lens.pretrained.weight_conversions import convert_qwen2_weights

    c = hf.config
    theta = (c.rope_parameters or {}).get("rope_theta") if hasattr(c, "rope_parameters") \
        else c.rope_theta
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size, d_head=c.hidden_size // c.num_attention_heads,
        n_heads=c.num_attention_heads, d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers, n_ctx=c.max_position_embeddings, eps=c.rms_norm_eps,
        d_vocab=c.vocab_size, act_fn=c.hidden_act, n_key_value_heads=c.num_key_value_heads,
        normalization_type="RMS", positional_embedding_type="rotary",
        rotary_adjacent_pairs=False, rotary_dim=c.hidden_size // c.num_attention_heads,
        final_rms=True, gated_mlp=True, rotary_base=theta,
        original_architecture="Qwen2ForCausalLM", default_prepend_bos=False, device="cpu",
        dtype=torch.float32)
    model = HookedTransformer(cfg, tokenizer=tokenizer, move_to_device=False)
    model.load_and_process_state_dict(
        convert_qwen2_weights(hf, cfg), fold_ln=False, center_writing_weights=False,
        center_unembed=False, fold_value_biases=False, refactor_factored_attn_matrices=False)
    return model.eval()


def _grouped_model(kind):
    import mechsink
    from mechsink.errors import MissingDependencyError
    from mechsink.model.zoo import gpt2_tokenizer

    hf = _qwen2_hf()
    if kind == "hooked_transformer":
        return hf, mechsink.wrap(_as_hooked_transformer(hf, gpt2_tokenizer()))
    try:
        return hf, mechsink.wrap(hf, gpt2_tokenizer())
    except MissingDependencyError as exc:  # TransformerLens 2/3: no usable bridge
        pytest.skip(str(exc))


KINDS = ["bridge", "hooked_transformer"]


@pytest.mark.parametrize("kind", KINDS)
def test_bias_split_on_a_grouped_model_with_key_biases(kind):
    """On grouped-query attention with key biases (where a HookedTransformer's ``b_K`` repeats
    each KV head per query head, while the keys hold one per KV head) the four parts still sum
    to the model's own scores, and each equals the scores' change when that bias is removed."""
    from mechsink.interventions.edits import remove_key_bias, remove_query_bias
    from mechsink.measure.query_bias import bias_logit_split

    hf, model = _grouped_model(kind)
    tokens = to_tokens(model, "Grouped keys share one bias per group.", prepend_bos=True)
    with torch.no_grad():  # the wrapped model computes what transformers computes
        torch.testing.assert_close(model(tokens), hf(tokens).logits, atol=1e-4, rtol=1e-4)
    causal = torch.ones(tokens.shape[1], tokens.shape[1]).tril().bool()
    for layer in range(model.cfg.n_layers):
        parts = bias_logit_split(model, tokens, layer).parts
        full = _scores(model, tokens, layer)
        no_q = _scores(model, tokens, layer, [remove_query_bias(model, layer)])
        none = _scores(model, tokens, layer, [remove_query_bias(model, layer),
                                              remove_key_bias(model, layer)])

        def close(a, b):
            torch.testing.assert_close(a[..., causal], b[..., causal], atol=1e-5, rtol=1e-5)

        close(sum(parts.values()), full)
        close(parts["content"], none)
        close(parts["query bias"] + parts["both biases"], full - no_q)
        assert parts["key bias"][..., causal].std() > 1e-3


@pytest.mark.parametrize("kind", KINDS)
def test_query_bias_study_reads_grouped_keys_per_query_head(kind):
    """The query-bias study's W_K with one entry per query head (and its key bias) rebuilds
    every query head's keys from the normalised residual, on either kind of model."""
    from mechsink.experiments.gpt2_query_bias import has_key_bias, per_query_head_keys
    from mechsink.model import key_bias

    _, model = _grouped_model(kind)
    tokens = to_tokens(model, "Grouped keys share one bias per group.", prepend_bos=True)
    _, cache = model.run_with_cache(tokens)
    assert has_key_bias(model, [0, 1])
    for layer in range(model.cfg.n_layers):
        x = cache[f"blocks.{layer}.ln1.hook_out" if kind == "bridge"
                  else f"blocks.{layer}.ln1.hook_normalized"].double()
        w_k = per_query_head_keys(model, layer).double()  # [head, d_model, d_head]
        assert w_k.shape[0] == model.cfg.n_heads
        b_k = key_bias(model)[layer].double().repeat_interleave(2, 0)  # [head, d_head]
        k = cache[f"blocks.{layer}.attn.hook_k"].double().repeat_interleave(2, 2)
        torch.testing.assert_close(torch.einsum("bpd,hde->bphe", x, w_k) + b_k, k,
                                   atol=1e-4, rtol=1e-4)
