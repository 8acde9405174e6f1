"""Secondary sinks: against loops over queries and keys by hand on a tiny model's cache, and the
criterion, layer span, massive channels and token names on a planted cache."""

from __future__ import annotations

import math

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.inputs.prompts import make_prompts
from mechsink.measure.secondary import HOOKS, SecondarySinks, min_queries, secondary_sinks


def test_secondary_scores_and_cosines_match_a_hand_computation(llama_tiny):
    tokens = make_prompts(llama_tiny, "natural", "bos", n=2, seq_len=12, seed=4).tokens
    names = [f"blocks.{layer}.{s}" for s in HOOKS for layer in range(llama_tiny.cfg.n_layers)]
    with torch.no_grad():
        _, cache = llama_tiny.run_with_cache(tokens, names_filter=names, return_type=None)
    got = secondary_sinks(cache, eps=0.2)
    t = tokens.shape[1]
    last = t - 1 - min_queries(t)  # the last scored key: at least T // 4 later queries
    assert got.scored.tolist() == [0 < k <= last for k in range(t)]
    for layer in range(llama_tiny.cfg.n_layers):
        a = cache[f"blocks.{layer}.attn.hook_pattern"].double()
        x = cache[f"blocks.{layer}.hook_resid_post"].double()
        for b in range(tokens.shape[0]):
            for k in range(1, last + 1):
                per_head = [sum(a[b, h, i, k].item() for i in range(k + 1, t)) / (t - 1 - k)
                            for h in range(a.shape[1])]
                assert got.top[b, layer, k].item() == pytest.approx(max(per_head), abs=1e-5)
                assert got.n_heads[b, layer, k].item() == sum(s > 0.2 for s in per_head)
                cos = (x[b, k] @ x[b, 0]) / (x[b, k].norm() * x[b, 0].norm())
                assert got.cosine[b, layer, k].item() == pytest.approx(cos.item(), abs=1e-5)
            assert math.isnan(got.top[b, layer, 0].item())
            assert math.isnan(got.top[b, layer, last + 1].item())


def _planted() -> dict[str, torch.Tensor]:
    """Two layers, one head, T = 8: key 3 takes half of every later query's attention in both
    layers; channel 5 is massive at position 0 in both layers
    and at position 3 in layer 1."""
    t, d = 8, 8
    cache = {}
    for layer in range(2):
        a = torch.zeros(1, 1, t, t)
        for i in range(t):
            a[0, 0, i, : i + 1] = 1.0 / (i + 1)
            if i > 3:
                a[0, 0, i, :] *= 0.5
                a[0, 0, i, 3] += 0.5
        cache[f"blocks.{layer}.attn.hook_pattern"] = a
        x = torch.ones(1, t, d)
        x[0, :, 1] = torch.arange(t).float()
        x[0, 0, 5] = 5000.0
        if layer == 1:
            x[0, 3, 5] = 3000.0
        cache[f"blocks.{layer}.hook_resid_post"] = x
    return cache


def test_planted_secondary_sink_is_found_named_and_spanned():
    tokens = torch.tensor([[10, 11, 12, 13, 14, 13, 16, 17]])
    got = secondary_sinks(_planted(), eps=0.3, tokens=tokens,
                          decode=lambda ids: [f"t{int(i)}" for i in ids])
    assert got.sink[0, :, 3].tolist() == [True, True]
    assert not got.sink[0, :, [1, 2, 4, 5]].any()  # 5 is scored (2 later queries), no sink
    rows = got.occurrences()
    assert [(r["position"], r["token"], r["layers"], r["n_layers"]) for r in rows] == \
        [(3, "t13", [0, 1], 2)]
    assert rows[0]["massive_channels_fire"] is True
    assert got.fires[0, :, 3].tolist() == [False, True]
    tok = got.by_token()
    # t13 occurs twice at scored positions (3 and 5), one of them a sink
    assert tok == [{"token": "t13", "sinks": 1, "occurrences": 2, "share": 0.5,
                    "mean_layers": 2.0, "mean_cosine_to_first": rows[0]["cosine_to_first"],
                    "massive_channels_fire": 1}]
    data = got.to_dict()["secondary_sinks"]
    assert data["count"] == 1 and data["positions"] == [1, 5] and data["tokens"] == tok
    assert data["rate"] == pytest.approx(1 / 5)
    merged = SecondarySinks.merge([got, got])
    assert len(merged.occurrences()) == 2 and merged.by_token()[0]["sinks"] == 2
    no_names = secondary_sinks(_planted())
    assert no_names.by_token() is None and no_names.to_dict()["secondary_sinks"]["count"] == 1


def test_secondary_bad_input():
    cache = _planted()
    with pytest.raises(BadInputError, match="shape"):
        secondary_sinks(cache, tokens=torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(BadInputError, match="eps"):
        secondary_sinks(cache, eps=0.0)


def test_secondary_sinks_are_in_the_census_with_token_names(llama_tiny):
    from mechsink.measure.census import census
    from mechsink.model import token_strings

    c = census(llama_tiny, ["natural"], ["bos"], n=3, seq_len=12, batch_size=2, seed=1,
               eps=0.1)
    got = c.run("natural", "bos").secondary
    tokens = make_prompts(llama_tiny, "natural", "bos", n=3, seq_len=12, seed=1).tokens
    assert got.tokens == tuple(tuple(token_strings(llama_tiny, row)) for row in tokens)
    data = c.run("natural", "bos").to_dict()["secondary_sinks"]
    assert data["count"] == len(got.occurrences())
    if data["count"]:
        first = data["examples"][0]
        assert first["token"] == got.tokens[first["sequence"]][first["position"]]
