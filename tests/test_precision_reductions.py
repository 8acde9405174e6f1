"""Metrics and census reductions accumulate in float32 on a bfloat16 model.

The reference is computed independently: the same bfloat16 activations captured with plain
TransformerLens hooks, reduced in float64 by hand.
"""

from __future__ import annotations

import pytest
import torch

from mechsink import load_model
from mechsink.measure import sink_scores
from mechsink.measure.wide import wide
from mechsink.patching import SinkScore, activation_patch, engine

LAYER = 1


@pytest.fixture(scope="module")
def llama_bf16():
    return load_model("random:llama-tiny", device="cpu", dtype="bfloat16", seed=0)


def _tokens(model, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, int(model.cfg.d_vocab), (2, 12), generator=g)


def _plain_sink(model, tokens, hooks=()):
    """Gu's sink score at key 0 of ``LAYER`` (mean over batch and heads), the bfloat16 pattern
    read with a plain hook and reduced in float64."""
    seen = {}

    def keep(act, hook):
        seen["p"] = act.detach().clone()

    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=[*hooks, (f"blocks.{LAYER}.attn.hook_pattern",
                                                         keep)])
    p = seen["p"]
    assert p.dtype == torch.bfloat16
    return float(p[..., :, 0].double().mean())


def test_wide_casts_only_narrow_floats():
    x = torch.tensor([1.0, 2.0])
    assert wide(x) is x
    assert wide(x.double()).dtype == torch.float64
    assert wide(x.bfloat16()).dtype == torch.float32
    assert wide(x.half()).dtype == torch.float32
    assert wide(torch.tensor([1, 2])).dtype == torch.int64


def test_bf16_patching_values_are_float32_reductions(llama_bf16):
    model = llama_bf16
    assert next(model.parameters()).dtype == torch.bfloat16
    clean, corrupted = _tokens(model, 1), _tokens(model, 2)
    saved = dict(engine.SPEEDUPS)
    engine.SPEEDUPS.update({k: False for k in saved})  # plain full forwards, one patch each
    try:
        res = activation_patch(model, clean, corrupted, "resid_pre", SinkScore(LAYER),
                               batch_size=1)
    finally:
        engine.SPEEDUPS.update(saved)
    values = res.values.double()
    seq = clean.shape[1]
    with torch.no_grad():
        src = {}

        def keep_as(name):
            return lambda act, hook: src.__setitem__(name, act.clone())

        names = [f"blocks.{layer}.hook_resid_pre" for layer in range(LAYER + 1)]
        model.run_with_hooks(clean, fwd_hooks=[(n, keep_as(n)) for n in names])
    expected = torch.empty(LAYER + 1, seq, dtype=torch.float64)
    for layer in range(LAYER + 1):
        name = f"blocks.{layer}.hook_resid_pre"
        for pos in range(seq):
            def patch(act, hook, pos=pos, name=name):
                act = act.clone()
                act[:, pos] = src[name][:, pos]
                return act

            expected[layer, pos] = _plain_sink(model, corrupted, [(name, patch)])
    assert torch.allclose(values[: LAYER + 1], expected, rtol=0, atol=2e-6), \
        (values[: LAYER + 1] - expected).abs().max()
    # not on bfloat16's grid of 1/256 near these values
    off_grid = (values * 256 - (values * 256).round()).abs() > 1e-3
    assert off_grid.float().mean() > 0.5
    assert res.clean_value == pytest.approx(_plain_sink(model, clean), abs=2e-6)
    assert res.corrupted_value == pytest.approx(_plain_sink(model, corrupted), abs=2e-6)


def test_bf16_census_sink_scores_are_float32_reductions(llama_bf16):
    model = llama_bf16
    tokens = _tokens(model, 3)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    got = sink_scores(cache, 0)
    for layer in range(int(model.cfg.n_layers)):
        p = cache[f"blocks.{layer}.attn.hook_pattern"]
        assert p.dtype == torch.bfloat16
        ref = p[..., :, 0].double().mean(-1)  # [batch, head]
        assert torch.allclose(got.gu[:, layer].double(), ref, rtol=0, atol=1e-6)
        ref_no_self = p[..., 1:, 0].double().mean(-1)
        assert torch.allclose(got.no_self[:, layer].double(), ref_no_self, rtol=0, atol=1e-6)
