"""Blocks with no hooks as plain transformers layers (#26 item 6): the model's outputs inside
:func:`fast_blocks` equal the bridge's own to 1e-6 (plain forwards, forwards from a layer,
hooked forwards, which fall back block by block), and every hook still fires."""

from __future__ import annotations

import pytest
import torch

from mechsink.model import act_name, run_from_layer
from mechsink.model.patches.fast_blocks import fast_blocks, hooks_empty, plain_copy

TOKENS = torch.randint(5, 500, (2, 9), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("fixture", ["llama_tiny", "gpt2_tiny"])
def test_plain_forward_is_exact(request, fixture):
    model = request.getfixturevalue(fixture)
    with torch.no_grad():
        ref = model(TOKENS)
        with fast_blocks(model) as on:
            got = model(TOKENS)
    assert on and "_mechsink_plain_layer" in model.blocks[0].__dict__  # the fast path ran
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    # the plain copy holds no bridge wrapper and shares the parameters
    plain = plain_copy(model.blocks[0].original_component)
    assert not any(type(m).__module__.startswith("transformer_lens") for m in plain.modules())
    assert {p.data_ptr() for p in plain.parameters()} <= {
        p.data_ptr() for p in model.blocks[0].parameters()}
    assert "forward" not in model.blocks[0].__dict__  # restored on exit


@pytest.mark.parametrize("fixture", ["llama_tiny", "gpt2_tiny"])
def test_hooked_and_partial_forwards_are_exact(request, fixture):
    model = request.getfixturevalue(fixture)
    seen: list[str] = []

    def double(act, hook):
        seen.append(hook.name)
        return act * 2

    name = act_name("mlp_out", 1)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS, names_filter=[act_name("resid_pre", 1)])
        resid = cache[act_name("resid_pre", 1)]
        ref = model.run_with_hooks(TOKENS, fwd_hooks=[(name, double)])
        ref_from = run_from_layer(model, resid, 1)
        with fast_blocks(model):
            assert hooks_empty(model.blocks[0])
            got = model.run_with_hooks(TOKENS, fwd_hooks=[(name, double)])
            got_from = run_from_layer(model, resid, 1)
    assert seen == [name, name]
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    torch.testing.assert_close(got_from, ref_from, atol=1e-6, rtol=0)


def test_recorded_keys_values_and_prefix_runs_are_exact(llama_tiny):
    """run_with_kv (a fresh cache, written) and a run reusing that prefix (the cache read:
    the bridge's path) give the same logits, keys and values inside fast_blocks."""
    from mechsink.model.forward import run_with_kv

    model = llama_tiny
    name = act_name("resid_pre", 1)
    with torch.no_grad():
        ref_logits, ref_acts, ref_kv = run_with_kv(model, TOKENS, {name})
        ref_from = run_from_layer(model, ref_acts[name][:, 4:], 1, prefix=(ref_kv, 4))
        with fast_blocks(model):
            logits, acts, kv = run_with_kv(model, TOKENS, {name})
            got_from = run_from_layer(model, acts[name][:, 4:], 1, prefix=(kv, 4))
    assert "_mechsink_plain_layer" in model.blocks[1].__dict__
    torch.testing.assert_close(logits, ref_logits, atol=1e-6, rtol=0)
    for a, b in zip(kv.keys + kv.values, ref_kv.keys + ref_kv.values, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    torch.testing.assert_close(got_from, ref_from, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_smollm2_logits_are_exact(smollm2):
    tokens = torch.randint(5, 40000, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = smollm2(tokens)
        with fast_blocks(smollm2):
            got = smollm2(tokens)
    assert "_mechsink_plain_layer" in smollm2.blocks[5].__dict__
    torch.testing.assert_close(got, ref, atol=1e-6 * float(ref.abs().max()), rtol=0)
