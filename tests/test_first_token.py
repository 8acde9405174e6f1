"""The first token the causal-chain experiments trace the sink on, the P0-sink circuit's "no BOS
needed" criterion, and a saved result judged again by today's criteria."""

from __future__ import annotations

import pytest

from mechsink.experiments import p0_sink
from mechsink.experiments.result import ExperimentResult
from mechsink.inputs.prompts import make_prompts
from mechsink.interventions.first_token import choose_variant, traced_prompts

# first-token sink rates measured on the atlas's models (natural text, 16 x 64 tokens)
QWEN = {"bos": 0.020, "nobos": 0.557, "randfirst": 0.496}
GEMMA = {"bos": 0.760, "nobos": 0.0, "randfirst": 0.0}
SMOLLM2 = {"bos": 0.690, "nobos": 0.716, "randfirst": 0.701}


@pytest.mark.parametrize(("rates", "expected"), [
    (SMOLLM2, "bos"),  # BOS wherever the model has a sink behind it, even a slightly weaker one
    (GEMMA, "bos"),
    (QWEN, "nobos"),  # no sink behind BOS: the variant where it is strongest
    ({"bos": 0.01, "nobos": 0.02, "randfirst": 0.3}, "randfirst"),
    ({"bos": 0.0, "nobos": 0.0, "randfirst": 0.0}, "bos"),  # no sink anywhere: BOS first
    ({"nobos": 0.0, "randfirst": 0.0}, "nobos"),  # a tokenizer without BOS
])
def test_the_sink_is_traced_behind_bos_unless_the_model_has_none_there(rates, expected):
    assert choose_variant(rates) == expected


def test_traced_prompts_read_each_variants_sink_rate_like_a_direct_count(gpt2_tiny):
    variant, rates, tokens = traced_prompts(gpt2_tiny, 3, 10)
    assert set(rates) == {"bos", "nobos", "randfirst"} and variant == choose_variant(rates)
    for v, t in tokens.items():
        assert t.equal(make_prompts(gpt2_tiny, "natural", v, n=3, seq_len=10).tokens)
        _, cache = gpt2_tiny.run_with_cache(t)
        above = 0
        for layer in range(gpt2_tiny.cfg.n_layers):
            pattern = cache[f"blocks.{layer}.attn.hook_pattern"]  # [batch, head, q, k]
            score = pattern[:, :, 1:, 0].mean(-1)  # queries after key 0
            above += (score > 0.3).sum().item()
        n_heads = gpt2_tiny.cfg.n_layers * gpt2_tiny.cfg.n_heads
        assert rates[v] == pytest.approx(above / (n_heads * t.shape[0]))


def _first(rates: dict[str, float]) -> dict[str, dict[str, float]]:
    return {v: {"sink_rate": r, "channel_max_abs": 1.0} for v, r in rates.items()}


@pytest.mark.parametrize(("rates", "expected"), [
    (QWEN, "supported"),  # the sink lives without BOS: nothing about it needs one
    (SMOLLM2, "supported"),
    (GEMMA, "not supported"),  # the sink needs the BOS token
    ({"bos": 0.4, "nobos": 0.3, "randfirst": 0.19}, "not supported"),
    ({"bos": 0.01, "nobos": 0.02, "randfirst": 0.04}, "no sink to explain"),
])
def test_no_bos_needed_is_judged_against_the_sink_where_it_is_strongest(rates, expected):
    assert p0_sink.bos_verdict(_first(rates)).startswith(expected)


def test_a_saved_result_is_judged_again_by_the_current_criteria():
    data = {"first_token": _first(QWEN), "traced_variant": "nobos",
            "through_channel": {
                "rows": [{"path": "clean", "late_sink_score": None}],
                "dose_response": {"half_effect": {"channel": None, "dose": None}}},
            "verdicts": {"no BOS needed": {"verdict": "no sink to explain", "criterion": "old",
                                           "evidence": "old"}}}
    judged = ExperimentResult("p0_sink", data).judged()
    assert judged.data["verdicts"]["no BOS needed"]["verdict"] == "supported"
    assert "largest first-token value" in judged.data["verdicts"]["no BOS needed"]["criterion"]
    assert data["verdicts"]["no BOS needed"]["verdict"] == "no sink to explain"  # not mutated
    other = ExperimentResult("query_bias_dose", {"verdicts": {"x": {}}})
    assert other.judged() is other  # an experiment without a verdicts function is left alone


def test_the_query_bias_dose_traces_the_first_token_the_model_has_its_sink_behind(monkeypatch):
    """C6 reads the sink where the model has it, like C2-C5: natural text with BOS unless there
    is no sink behind BOS (a model like Qwen2.5-0.5B), then the variant ``traced_prompts``
    chooses; the result records it."""
    from mechsink import load_model
    from mechsink.experiments import query_bias_dose

    model = load_model("organism:bb-gpt2-tiny")  # trained: a query bias to dose
    name = "bb-gpt2-tiny on natural text"  # not an organism name: no task inputs
    n, seq_len = 8, 12
    prompts = {v: make_prompts(model, "natural", v, n=n, seq_len=seq_len).tokens
               for v in ("bos", "nobos", "randfirst")}
    monkeypatch.setattr(query_bias_dose, "traced_prompts",
                        lambda model, n_, t_: ("nobos", dict.fromkeys(prompts, 0.0), prompts))
    seen = []
    real = query_bias_dose.dose_response
    monkeypatch.setattr(query_bias_dose, "dose_response",
                        lambda model, tokens, *a, **k: seen.append(tokens) or real(
                            model, tokens, *a, **k))
    data = query_bias_dose.run(model, model_name=name, n=n, seq_len=seq_len,
                               top=1, doses=(0.0, 0.5, 1.0)).data
    assert data["traced_variant"] == "nobos" and "no sink behind BOS" in data["inputs"]
    assert seen and all(t.equal(prompts["nobos"]) for t in seen)
    monkeypatch.setattr(query_bias_dose, "traced_prompts", traced_prompts)  # the real choice
    chosen = traced_prompts(model, n, seq_len)[0]
    assert query_bias_dose.run(model, model_name=name, n=n, seq_len=seq_len,
                               top=1, doses=(0.0, 0.5, 1.0)).data["traced_variant"] == chosen
