"""Claim C7's measurements against hand computations with plain transformers, the W_O init
intervention at step 0, and the experiment's JSON round trip."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mechsink import load_model
from mechsink.errors import BadInputError
from mechsink.measure.seedprint import (
    contraction_stats,
    depth_preference,
    init_model,
    random_tokens,
    residual_stack,
    scaled_weights,
)
from mechsink.model import hf_model_of
from mechsink.training.loop import get_recipe, train


def _hand_contraction(h: torch.Tensor) -> dict[str, float]:
    """Mean pairwise cosines from the full cosine matrix of every (sequence, position)."""
    n, seq, _ = h.shape
    flat = h.double().flatten(0, 1)
    cos = F.cosine_similarity(flat[:, None], flat[None], dim=-1).view(n, seq, n, seq)
    across, within, first, later = [], [], [], []
    for a, p, b, q in itertools.product(range(n), range(seq), range(n), range(seq)):
        if a != b:
            across.append(cos[a, p, b, q])
        elif p != q:
            within.append(cos[a, p, b, q])
            if p == 0:
                first.append(cos[a, p, b, q])
            elif q != 0:
                later.append(cos[a, p, b, q])
    return {k: torch.stack(v).mean().item() for k, v in
            (("across", across), ("within", within), ("first_to_later", first),
             ("later_to_later", later))}


def _last_block_output(hf: torch.nn.Module, tokens: torch.Tensor) -> tuple[tuple, torch.Tensor]:
    """transformers' hidden states, and the last block's raw output (its last hidden state
    is after the final norm)."""
    blocks = hf.transformer.h if hasattr(hf, "transformer") else hf.model.layers
    seen = {}
    handle = blocks[-1].register_forward_hook(
        lambda _m, _i, out: seen.__setitem__("x", out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            out = hf(tokens, output_hidden_states=True)
    finally:
        handle.remove()
    return out.hidden_states, seen["x"]


def _plain(spec: str) -> torch.nn.Module:
    """The same random model as ``init_model(spec, seed=0)``, plain transformers, never
    wrapped."""
    from mechsink.model.zoo.random_init import random_config, seeded_model

    return seeded_model(random_config(spec), 0).eval()


@pytest.mark.parametrize("spec", ["gpt2-tiny", "llama-tiny"])
def test_contraction_per_layer_matches_cosines_of_transformers_hidden_states(spec):
    model = init_model(spec, seed=0)
    hf = _plain(spec)
    tokens = random_tokens(model, n=3, seq_len=6, seed=1)
    stack = residual_stack(model, tokens)
    hidden, last = _last_block_output(hf, tokens)
    layers = int(model.cfg.n_layers)
    assert stack.shape[0] == layers + 1
    reference = [*hidden[:layers], last]  # block inputs, then the last block's output
    for k, h in enumerate(reference):
        torch.testing.assert_close(stack[k], h.float(), atol=1e-4, rtol=1e-4)
        got = contraction_stats(stack[k]).to_dict()
        hand = _hand_contraction(h)
        for key, value in hand.items():
            assert got[key] == pytest.approx(value, abs=1e-5), (k, key)
        assert got["discrepancy"] == pytest.approx(hand["later_to_later"] -
                                                   hand["first_to_later"], abs=1e-5)


@pytest.mark.parametrize("spec", ["gpt2-tiny", "llama-tiny"])
def test_token_preference_by_depth_matches_a_truncated_model_s_own_logits(spec):
    model = init_model(spec, seed=0)
    hf = _plain(spec)
    tokens = random_tokens(model, n=8, seq_len=5, seed=2)
    prefs = depth_preference(model, residual_stack(model, tokens))

    def hand_ratio(net: torch.nn.Module) -> float:
        with torch.no_grad():
            logits = net(tokens).logits[:, -1].double()
        mean = logits.softmax(-1).mean(0).numpy()
        assert mean.size % 2 == 1  # an odd vocabulary: the median is one entry
        return float(mean.max() / np.median(mean))

    assert prefs[-1].ratio == pytest.approx(hand_ratio(hf), rel=1e-4)
    key = "n_layer" if hasattr(hf.config, "n_layer") else "num_hidden_layers"
    shallow_config = hf.config.__class__(**{**hf.config.to_dict(), key: 1})
    shallow = type(hf)(shallow_config).eval()
    missing, _ = shallow.load_state_dict(hf.state_dict(), strict=False)
    assert not [m for m in missing if "lm_head" not in m]
    shallow.tie_weights()
    assert prefs[0].ratio == pytest.approx(hand_ratio(shallow), rel=1e-4)


def test_token_preference_by_depth_is_the_same_unembedded_in_one_call_or_one_depth_a_call(
        monkeypatch):
    from mechsink.measure import seedprint

    model = init_model("llama-tiny", seed=0)
    stack = residual_stack(model, random_tokens(model, n=4, seq_len=5, seed=3))
    together = depth_preference(model, stack)
    monkeypatch.setattr(seedprint, "UNEMBED_ROWS", 1)  # one depth per call
    alone = depth_preference(model, stack)
    assert len(together) == len(alone) == stack.shape[0] - 1
    for a, b in zip(together, alone, strict=True):
        assert a.top_token == b.top_token
        assert a.ratio == pytest.approx(b.ratio, rel=1e-5)


def test_scaled_weights_scales_matrices_only_and_restores_them_bit_for_bit():
    model = init_model("llama-tiny", seed=0)
    params = list(hf_model_of(model).parameters())
    before = [p.detach().clone() for p in params]
    tokens = random_tokens(model, n=2, seq_len=4, seed=0)
    clean = residual_stack(model, tokens)
    with scaled_weights(model, 2.0):
        for p, b in zip(params, before, strict=True):
            torch.testing.assert_close(p.detach(), 2 * b if b.dim() >= 2 else b, rtol=0, atol=0)
        # the forward sees it: embeddings (a matrix) doubled
        torch.testing.assert_close(residual_stack(model, tokens)[0], 2 * clean[0])
    assert all(torch.equal(p.detach(), b) for p, b in zip(params, before, strict=True))
    assert any(b.dim() == 1 for b in before)  # norm gains were there to be left alone
    with pytest.raises(BadInputError, match="positive"):
        scaled_weights(model, 0.0)


# bb-llama-tiny's model, one short step (only the step-0 checkpoint is read)
TINY = dataclasses.replace(get_recipe("bb-llama-tiny"), name="c7-tiny", seq_len=16, batch_size=2,
                           steps=1, warmup=1)


def test_recipe_names_carry_the_wo_init_scale():
    assert get_recipe("bb-gpt2-tiny+wo16").init_attn_out_scale == 16.0
    assert get_recipe("bb-llama-tiny+wo0.5+hwrms").init_attn_out_scale == 0.5
    assert get_recipe("bb-gpt2-tiny").init_attn_out_scale == 1.0
    with pytest.raises(BadInputError, match="wo<scale>"):
        get_recipe("bb-gpt2-tiny+wo1+wo2")
    with pytest.raises(BadInputError, match="wo<scale>"):
        get_recipe("bb-gpt2-tiny+wox")


def test_wo_init_scale_removes_and_amplifies_the_discrepancy_at_step_0(tmp_path):
    from mechsink.experiments.init_structure import step0_discrepancy
    from mechsink.model import act_name

    got, weights = {}, {}
    for scale in (0.0, 1.0, 4.0):
        out = tmp_path / f"wo{scale:g}"
        train(dataclasses.replace(TINY, init_attn_out_scale=scale), out, seed=0, progress=False)
        got[scale] = step0_discrepancy(out)
        model = load_model(f"organism:{out / 'step-0'}", device="cpu")
        weights[scale] = hf_model_of(model).model.layers[1].self_attn.o_proj.weight.clone()
        if scale == 0.0:  # attention writes nothing into the residual stream
            name = act_name("attn_out", 1)
            _, cache = model.run_with_cache(random_tokens(model, 2, 8, seed=0),
                                            names_filter=[name])
            assert cache[name].abs().max().item() == 0.0
    torch.testing.assert_close(weights[4.0], 4 * weights[1.0])  # same seed otherwise
    assert abs(got[0.0]["discrepancy"]) < 0.02  # removed
    assert got[1.0]["discrepancy"] > 0.03  # the plain init has one
    assert got[4.0]["discrepancy"] > got[1.0]["discrepancy"] + 0.1  # amplified


def test_init_structure_result_round_trips_and_the_atlas_cell_reads_it(tmp_path):
    from mechsink.experiments import ExperimentResult
    from mechsink.experiments.atlas import c7_cell
    from mechsink.experiments.init_structure import run

    result = run(work_dir=tmp_path / "work", twins=["random:gpt2-tiny"], twin_seeds=[0, 1],
                 n=3, seq_len=6, scales=[1.0, 2.0], recipe="bb-llama-tiny",
                 wo_scales=[0.0, 1.0], seeds=[0, 1], steps=2, seedprint_steps=1,
                 null_inits=3, held_out_inits=2, k=4)
    out = result.save(tmp_path / "out")
    again = ExperimentResult.load(out, "init_structure")
    assert again.data == result.data
    assert again.summary() == (out / "summary.md").read_text()
    assert (out / "init_structure.png").stat().st_size > 5_000
    twin = again.data["twins"]["random:gpt2-tiny"]
    assert set(twin["profiles"]) == {"0", "1"} and len(twin["overlap_across_seeds"]) == 1
    assert len(twin["profiles"]["0"]["scales"]["2"]["preference"]) == 2  # one per depth
    arms = again.data["organisms"]["arms"]
    assert list(arms) == ["0", "1"] and len(arms["0"]["final_max_sink_score"]) == 2
    assert set(again.data["organisms"]["verdicts"]) == {
        "(ii) SeedPrint across seeds", "(iii) discrepancy causes the sink"}
    cell = c7_cell(twin)
    assert cell["verdict"] in ("supported", "partial", "not supported")
    assert "(ii) SeedPrint" in cell["criterion"] and "max/median" in cell["evidence"]
    with pytest.raises(BadInputError, match="include 1"):
        run(work_dir=tmp_path / "bad", twins=[], wo_scales=[0.0, 2.0])


def test_atlas_c7_twins_are_fresh_inits_of_the_model_s_architecture():
    from mechsink.experiments.atlas import TWIN_SEEDS, c7_cell, c7_twins
    from mechsink.experiments.init_structure import twin_factory

    organism = load_model("organism:bb-gpt2-tiny", device="cpu")
    trained = hf_model_of(organism)
    build = twin_factory(organism)
    twin = hf_model_of(build(0))
    assert twin.config.to_dict() == trained.config.to_dict()
    assert not torch.equal(twin.transformer.wte.weight, trained.transformer.wte.weight)
    assert torch.equal(twin.transformer.wte.weight, hf_model_of(build(0)).transformer.wte.weight)
    twins = c7_twins(build, {"seed": 5, "n": 3, "seq_len": 8})
    assert twins["seeds"] == [5 + i for i in range(TWIN_SEEDS)]
    cell = c7_cell(twins)
    parts = twins["verdicts"]
    held = [v["verdict"] == "supported" for v in parts.values()]
    assert cell["verdict"] == ("supported" if all(held) else "partial" if any(held)
                               else "not supported")
    assert cell["link"] is None and "unknown here" in cell["criterion"]


@pytest.mark.parametrize("diffs,moved,expected", [
    ([0.1, 0.2, 0.15], 0.4, "supported"),  # amplified, sink up in every seed
    ([-0.1, -0.2, -0.15], 0.4, "not supported"),  # amplified, sink down
    ([-0.1, 0.2, 0.05], 0.4, "undecided"),  # no effect beyond seed noise
    ([0.1, 0.2, 0.15], 0.01, "undecided"),  # the arm did not move the discrepancy
])
def test_causal_verdict_reads_paired_differences_against_the_plain_arm(diffs, moved, expected):
    from mechsink.experiments.init_structure import causal_verdict

    plain = [0.3, 0.4, 0.5]
    arms = {"1": {"step0": [0.1] * 3, "final_max_sink_score": plain},
            "16": {"step0": [0.1 + moved] * 3,
                   "final_max_sink_score": [p + d for p, d in zip(plain, diffs, strict=True)]}}
    assert causal_verdict(arms)["verdict"] == expected
    with pytest.raises(BadInputError, match="plain arm"):
        causal_verdict({"16": arms["16"]})
