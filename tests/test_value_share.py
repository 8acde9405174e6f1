"""Value-weighted sink share: against transformers' own attention weights and value projection
computed by hand, and the dormant rule on planted patterns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.inputs.prompts import make_prompts
from mechsink.measure.value_share import HOOKS, ValueShare, key0_share, value_shares


def _cache(model, tokens):
    names = [f"blocks.{layer}.{s}" for s in HOOKS for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
    return cache


def test_value_share_matches_transformers_attentions_and_values_by_hand(llama_tiny):
    """random:llama-tiny (4 query heads / 2 KV heads): the share from the bridge's cache equals
    a loop over queries on a plain transformers model's eager attention weights and its value
    projection applied by hand to its own hidden states (GQA: query head h reads KV head h//2)."""
    from mechsink.model.zoo import random_hf_model

    tokens = make_prompts(llama_tiny, "random", "bos", n=3, seq_len=12, seed=2).tokens
    got = value_shares(_cache(llama_tiny, tokens))
    plain, _ = random_hf_model("llama-tiny", seed=0)
    with torch.no_grad():
        out = plain(tokens, output_attentions=True, output_hidden_states=True)
    cfg = plain.config
    n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d_head = cfg.hidden_size // n_heads
    assert n_kv < n_heads  # grouped-query attention is exercised
    expected = np.zeros((tokens.shape[0], cfg.num_hidden_layers, n_heads))
    for layer, block in enumerate(plain.model.layers):
        with torch.no_grad():
            v = block.self_attn.v_proj(block.input_layernorm(out.hidden_states[layer]))
        v = v.double().numpy().reshape(tokens.shape[0], tokens.shape[1], n_kv, d_head)
        attn = out.attentions[layer].double().numpy()  # [batch, head, query, key]
        for b in range(tokens.shape[0]):
            for h in range(n_heads):
                g = h // (n_heads // n_kv)
                ratios = []
                for i in range(1, tokens.shape[1]):
                    total = sum(attn[b, h, i, j] * v[b, j, g] for j in range(i + 1))
                    ratios.append(np.linalg.norm(attn[b, h, i, 0] * v[b, 0, g])
                                  / np.linalg.norm(total))
                expected[b, layer, h] = np.mean(ratios)
    np.testing.assert_allclose(got.share.numpy(), expected, rtol=1e-4, atol=1e-6)
    gu = np.stack([a.double().numpy()[..., :, 0].mean(-1) for a in out.attentions], 1)
    np.testing.assert_allclose(got.weight.numpy(), gu, atol=1e-5)


def test_dormant_rule_on_planted_patterns():
    """Two heads both pour 0.9 of every query's attention onto key 0 (sinks by weight): the one
    whose v_0 is tiny is dormant, the one whose v_0 is ordinary is active; a head that looks
    at its own token is no sink."""
    t, d = 6, 4
    sink = torch.zeros(t, t)
    sink[:, 0] = 0.9
    sink[0, 0] = 1.0
    for i in range(1, t):
        sink[i, 1:i + 1] = 0.1 / i
    diag = torch.eye(t)
    pattern = torch.stack([sink, sink, diag])[None]  # [1, head, q, k]
    v = torch.ones(1, t, 3, d)
    v[0, 0, 0] = 1e-3  # head 0: drained sink value
    cache = {"blocks.0.attn.hook_pattern": pattern, "blocks.0.attn.hook_v": v}
    got = value_shares(cache)
    assert got.sink[0, 0].tolist() == [True, True, False]
    assert got.dormant[0, 0].tolist() == [True, False, False]
    assert got.dormant_share == pytest.approx(0.5)
    # head 1: every value equal, so the share is exactly the weight on key 0 (0.9)
    assert got.share[0, 0, 1].item() == pytest.approx(0.9, abs=1e-6)
    assert got.share[0, 0, 2].item() == 0.0  # the diagonal head never reads key 0 after i = 0
    data = got.to_dict()
    assert data["sink_heads_dormant_share"] == pytest.approx(0.5)
    assert [(h["layer"], h["head"], h["dormant_fraction"])
            for h in data["sink_heads_value_share"]] == [(0, 0, 1.0), (0, 1, 0.0)]
    merged = ValueShare.merge([got, got])
    assert merged.share.shape == (2, 1, 3) and merged.dormant_share == pytest.approx(0.5)


def test_value_share_bad_input():
    with pytest.raises(BadInputError, match="two positions"):
        key0_share(torch.ones(1, 2, 1, 1), torch.ones(1, 1, 2, 3))
    with pytest.raises(BadInputError, match="evenly"):
        key0_share(torch.ones(1, 3, 2, 2), torch.ones(1, 2, 2, 3))
    with pytest.raises(BadInputError, match="eps"):
        value_shares({}, eps=1.5)


def test_value_share_is_in_the_census(llama_tiny):
    from mechsink.measure.census import census

    c = census(llama_tiny, ["natural"], ["bos"], n=3, seq_len=8, batch_size=2, seed=1)
    run = c.run("natural", "bos")
    tokens = make_prompts(llama_tiny, "natural", "bos", n=3, seq_len=8, seed=1).tokens
    direct = value_shares(_cache(llama_tiny, tokens))
    torch.testing.assert_close(run.value_share.share, direct.share, rtol=1e-5, atol=1e-6)
    data = run.to_dict()
    assert len(data["value_share"]) == llama_tiny.cfg.n_layers
    assert "sink_heads_dormant_share" in data
