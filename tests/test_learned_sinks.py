"""Learned sink slot (GPT-OSS) and output gate (Qwen3-Next) on tiny random-init models, against
transformers' own computation: its rotated queries and keys, attention mask and ``sinks``
parameter captured at the attention call, the softmax with the sink logit taken by hand; its
ungated attention output against the gated input of the output projection."""

from __future__ import annotations

import sys

import pytest
import torch
import transformers
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from mechsink.measure.learned_sinks import attention_extras, learned_sinks
from tests.architectures.builder import build_model, tiny_config

EPS = 0.3
TOKENS = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(2))


def _capture(seen: list):
    """An attention function that records what transformers passes it, then runs the model's
    own eager attention."""

    def attend(module, query, key, value, attention_mask, **kwargs):
        eager = sys.modules[type(module).__module__].eager_attention_forward
        out, weights = eager(module, query, key, value, attention_mask, **kwargs)
        seen.append({"q": query.detach(), "k": key.detach(), "mask": attention_mask,
                     "scaling": kwargs.get("scaling", module.scaling),
                     "sinks": getattr(module, "sinks", None), "out": out.detach()})
        return out, weights

    return attend


def _plain(arch: str):
    """The tiny model (builder's seed 0) with every attention call captured."""
    if arch == "Qwen3NextForCausalLM":  # its full-attention layers (the linear-attention
        config = tiny_config(arch)      # layers have no softmax to gate)
        config.layer_types = ["full_attention"] * config.num_hidden_layers
        torch.manual_seed(0)
        model = transformers.Qwen3NextForCausalLM._from_config(
            config, attn_implementation="eager").eval()
    else:
        model = build_model(arch)
    seen: list = []
    AttentionInterface.register("mechsink_capture", _capture(seen))
    AttentionMaskInterface.register("mechsink_capture", eager_mask)  # the causal mask as eager
    model.config._attn_implementation = "mechsink_capture"
    for layer in model.model.layers:
        layer.self_attn.config._attn_implementation = "mechsink_capture"
    return model, seen


def _softmax_with_sinks(step) -> torch.Tensor:
    """transformers' q/k and sinks: the softmax over keys and the sink logit, by hand
    ``[batch, head, query, key + 1]`` (the last column is the slot)."""
    q, k = step["q"].double(), step["k"].double()
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    assert step["mask"] is not None  # transformers gave the causal mask
    logits = q @ k.transpose(-1, -2) * step["scaling"] + step["mask"][..., :k.shape[-2]].double()
    sinks = step["sinks"].detach().double().view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
    return torch.softmax(torch.cat([logits, sinks], -1), -1)


def test_gpt_oss_slot_mass_matches_the_softmax_with_its_sink_logit():
    import mechsink

    bridge = mechsink.wrap(build_model("GptOssForCausalLM"))
    extras = attention_extras(bridge)
    assert extras.slot_layers == (0, 1) and extras.gate_layers == ()
    _, cache = bridge.run_with_cache(TOKENS)
    got = learned_sinks(cache, extras, EPS)

    hf, seen = _plain("GptOssForCausalLM")
    with torch.no_grad():
        hf(TOKENS, use_cache=False)
    assert len(seen) == 2
    for layer, step in enumerate(seen):
        probs = _softmax_with_sinks(step)
        want_slot = probs[:, :, 1:, -1].mean(-1)
        want_key0 = probs[:, :, 1:, 0].mean(-1)
        torch.testing.assert_close(got.slot[:, layer].double(), want_slot, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.slot_key0[:, layer].double(), want_key0, rtol=1e-4,
                                   atol=1e-5)
    assert float(got.slot.min()) > 0.01  # the slot takes real mass (not vacuous)
    out = got.to_dict()["learned_sinks"]["slot"]
    assert out["layers"] == [0, 1] and "gate" not in got.to_dict()["learned_sinks"]
    assert out["mean_slot_mass"] == pytest.approx(float(got.slot.double().mean()), rel=1e-3)


def test_qwen3_next_gate_suppression_matches_transformers_gated_output():
    import mechsink

    config = tiny_config("Qwen3NextForCausalLM")
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    torch.manual_seed(0)
    bridge = mechsink.wrap(transformers.Qwen3NextForCausalLM._from_config(
        config, attn_implementation="eager").eval())
    extras = attention_extras(bridge)
    assert extras.gate_layers == (0, 1) and extras.slot_layers == ()
    _, cache = bridge.run_with_cache(TOKENS)
    got = learned_sinks(cache, extras, EPS)

    hf, seen = _plain("Qwen3NextForCausalLM")
    gate_in, o_in = [], []
    hooks = []
    for layer in hf.model.layers:
        attn = layer.self_attn
        hooks.append(attn.q_proj.register_forward_hook(
            lambda m, a, o: gate_in.append(o.detach())))
        hooks.append(attn.o_proj.register_forward_pre_hook(
            lambda m, a: o_in.append(a[0].detach())))
    try:
        with torch.no_grad():
            hf(TOKENS, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    n_heads, d_head = config.num_attention_heads, config.head_dim
    key0_all, passed_all = [], []
    for layer, step in enumerate(seen):
        ungated = step["out"].double()  # [batch, query, head, d_head]: before the gate
        gated = o_in[layer].double().unflatten(-1, (n_heads, d_head))
        ratio = (gated.norm(dim=-1) / ungated.norm(dim=-1))[:, 1:].mean(1)
        gate = gate_in[layer].view(*TOKENS.shape, n_heads, 2 * d_head)[..., d_head:]
        mean_gate = torch.sigmoid(gate.double())[:, 1:].mean((1, 3))
        torch.testing.assert_close(got.passed[:, layer].double(), ratio, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.gate[:, layer].double(), mean_gate, rtol=1e-4, atol=1e-5)
        q, k = step["q"].double(), step["k"].double()
        k = k.repeat_interleave(n_heads // k.shape[1], dim=1)
        logits = q @ k.transpose(-1, -2) * step["scaling"] + step["mask"].double()
        key0 = torch.softmax(logits, -1)[:, :, 1:, 0].mean(-1)
        torch.testing.assert_close(got.gate_key0[:, layer].double(), key0, rtol=1e-4,
                                   atol=1e-5)
        key0_all.append(key0)
        passed_all.append(ratio)
    assert float((got.passed - 1).abs().max()) > 0.05  # the gate does suppress (not vacuous)
    key0, passed = torch.stack(key0_all, 1), torch.stack(passed_all, 1)
    sink = key0 > EPS
    out = got.to_dict()["learned_sinks"]["gate"]
    if sink.any():
        assert out["passed_sink_heads"] == pytest.approx(float(passed[sink].mean()), rel=1e-3)
    else:
        assert out["passed_sink_heads"] is None
    assert out["passed_other_heads"] == pytest.approx(float(passed[~sink].mean()), rel=1e-3)


def test_census_reports_the_slot_and_leaves_a_plain_model_as_it_was(llama_tiny):
    import mechsink
    from mechsink.inputs.prompts import PromptSet
    from mechsink.measure.census import census

    model = mechsink.wrap(build_model("GptOssForCausalLM"))
    run = census(model, prompts=[PromptSet("random", "nobos", TOKENS, 0)],
                 progress=lambda *a: 0).to_dict()["runs"][0]
    slot = run["learned_sinks"]["slot"]
    assert slot["layers"] == [0, 1] and slot["mean_slot_mass"] > 0.01
    plain = census(llama_tiny, ["random"], ["bos"], n=2, seq_len=8,
                   progress=lambda *a: 0).to_dict()["runs"][0]
    assert "learned_sinks" not in plain and "learned_sinks" not in plain.get(
        "not_applicable", {})


def test_a_lab_sink_logit_organism_is_accounted_the_same_way():
    """The training lab's sink-logit variant: the slot's mass is the softmax over the bridge's
    own scaled, masked logits (``hook_attn_scores``) and the variant's logit, by hand."""
    import mechsink
    from mechsink.model.variants import apply_attention_variant
    from mechsink.model.zoo import random_hf_model

    hf, _ = random_hf_model("llama-tiny", seed=0)
    apply_attention_variant(hf, "sink_logit")
    logits = []
    with torch.no_grad():
        for i, layer in enumerate(hf.model.layers):
            layer.self_attn.o_proj.sink_logit.copy_(torch.tensor([-1.0, 0.0, 1.0, 2.0]) + i)
            logits.append(layer.self_attn.o_proj.sink_logit.detach().double())
    bridge = mechsink.wrap(hf)
    extras = attention_extras(bridge)
    assert extras.slot_layers == (0, 1) and extras.slot_kind == "attention variant sink_logit"
    _, cache = bridge.run_with_cache(TOKENS)
    got = learned_sinks(cache, extras, EPS)
    for layer, logit in enumerate(logits):
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"].double()
        slot = logit.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, slot], -1), -1)
        torch.testing.assert_close(got.slot[:, layer].double(), probs[:, :, 1:, -1].mean(-1),
                                   rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got.slot_key0[:, layer].double(),
                                   probs[:, :, 1:, 0].mean(-1), rtol=1e-4, atol=1e-5)
