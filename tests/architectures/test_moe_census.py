"""Mixture of experts in the census: super neurons per expert (the expert's down-projection input)
and the router's choice at position 0, on tiny random-init Mixtral and Qwen3-MoE models built
from transformers configs, against a hand computation with transformers' own router and experts
(the hand formula for an expert's down-projection input is itself checked against transformers'
own experts forward)."""

from __future__ import annotations

import pytest
import torch

from tests.architectures.builder import build_model
from tests.parity_refs import torch_hooks

LAYER, EXPERT, NEURON, CHANNEL = 1, 2, 5, 11  # the planted super neuron
ARCHS = ("MixtralForCausalLM", "Qwen3MoeForCausalLM")


def _planted(arch: str):
    """A tiny MoE model whose expert 2 of block 1 has neuron 5 with gate and up rows 100x (its
    input reaches hundreds) and a unit weight from it into channel 11."""
    hf = build_model(arch)
    experts = hf.model.layers[LAYER].mlp.experts
    d_expert = experts.down_proj.shape[2]
    with torch.no_grad():
        experts.gate_up_proj[EXPERT, NEURON] *= 100.0
        experts.gate_up_proj[EXPERT, d_expert + NEURON] *= 100.0
        experts.down_proj[EXPERT, CHANNEL, NEURON] = 1.0
    return hf


def _tokens() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, 64, (4, 10), generator=gen)  # no BOS: its embedding is the pad's


def _reference(hf, tokens):
    """transformers' own forward: per block the sparse block's input, its router's choice
    (the model's gate module) and each routed expert's down-projection input by hand."""
    inputs = {}
    with torch_hooks(*(layer.mlp.register_forward_hook(
            lambda mod, args, out, i=i: inputs.__setitem__(i, args[0].detach()))
            for i, layer in enumerate(hf.model.layers))), torch.no_grad():
        hf(tokens)
    out = {}
    for i, layer in enumerate(hf.model.layers):
        x = inputs[i].reshape(-1, inputs[i].shape[-1])
        with torch.no_grad():
            _, weights, idx = layer.mlp.gate(x)
            ex = layer.mlp.experts
            d_expert = ex.down_proj.shape[2]
            hidden = {}
            total = torch.zeros_like(x)
            for e in range(ex.down_proj.shape[0]):
                g, u = ex.gate_up_proj[e, :d_expert], ex.gate_up_proj[e, d_expert:]
                hidden[e] = torch.nn.functional.silu(x @ g.T) * (x @ u.T)
                w = (weights * (idx == e)).sum(-1, keepdim=True)
                total += w * (hidden[e] @ ex.down_proj[e].T)
            own = ex(x, idx, weights)  # transformers' own experts forward
        torch.testing.assert_close(total, own, atol=1e-5, rtol=1e-5)
        out[i] = (x, weights, idx, hidden)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_moe_census_reports_experts_and_router_as_transformers_computes_them(arch):
    import mechsink
    from mechsink.inputs.prompts import PromptSet
    from mechsink.measure.census import census

    tokens = _tokens()
    model = mechsink.wrap(_planted(arch))
    c = census(model, prompts=[PromptSet("random", "nobos", tokens, 0)], progress=lambda *a: 0)
    run = c.to_dict()["runs"][0]
    assert set(run["not_applicable"]) == {"mlp", "super_sets"}  # one down projection each
    got = run["experts"]
    ref = _reference(_planted(arch), tokens)
    n_pos = tokens.shape[1]
    for layer, (_x, weights, idx, hidden) in ref.items():
        # the router at position 0: experts, how many sequences chose each, mean weight
        first = torch.arange(tokens.shape[0]) * n_pos
        chosen: dict[int, list[float]] = {}
        for b in first.tolist():
            for e, w in zip(idx[b].tolist(), weights[b].tolist(), strict=True):
                chosen.setdefault(e, []).append(w)
        row = got["router_at_position_0"][layer]
        assert {r["expert"]: r["sequences"] for r in row["experts"]} == {
            e: len(ws) for e, ws in chosen.items()}
        for r in row["experts"]:
            assert r["mean_weight"] == pytest.approx(sum(chosen[r["expert"]]) /
                                                     len(chosen[r["expert"]]), rel=1e-4)
        # per expert: the largest |down-projection input| over its routed positions, mean over
        # the sequences that routed anything to it
        for e, h in hidden.items():
            per_seq = []
            for b in range(tokens.shape[0]):
                rows = [b * n_pos + p for p in range(n_pos) if e in idx[b * n_pos + p].tolist()]
                if rows:
                    per_seq.append(float(h[rows].abs().max()))
            want = sum(per_seq) / len(per_seq) if per_seq else None
            value = got["max_abs_input"][layer][e]
            assert (value is None) if want is None else value == pytest.approx(want, rel=1e-4)
    # the planted neuron is found as a super neuron of its expert, writing its channel
    x, weights, idx, hidden = ref[LAYER]
    routed = [t for t in range(x.shape[0]) if EXPERT in idx[t].tolist()
              and abs(float(hidden[EXPERT][t, NEURON])) > 50]
    assert routed, "the plant must reach the spike threshold somewhere"
    found = [s for s in got["super_neurons"] if (s["layer"], s["expert"], s["neuron"]) ==
             (LAYER, EXPERT, NEURON)]
    assert found and found[0]["channel"] == CHANNEL
    assert sum(s["count"] for s in found) <= len(routed)  # only where the output spikes too


def test_an_expert_layout_it_cannot_read_is_not_applicable_not_a_crash():
    import mechsink
    from mechsink.inputs.prompts import PromptSet
    from mechsink.measure.census import census

    model = mechsink.wrap(build_model("GptOssForCausalLM"))
    c = census(model, prompts=[PromptSet("random", "nobos", _tokens(), 0)],
               progress=lambda *a: 0)
    run = c.to_dict()["runs"][0]
    assert "GptOssExperts" in run["not_applicable"]["experts"]
    assert "experts" not in run and run["sink_rate"] is not None


def test_a_dense_model_has_no_experts_entry(llama_tiny):
    from mechsink.measure.census import census

    run = census(llama_tiny, ["random"], ["bos"], n=2, seq_len=8,
                 progress=lambda *a: 0).to_dict()["runs"][0]
    assert "experts" not in run and "experts" not in run.get("not_applicable", {})
