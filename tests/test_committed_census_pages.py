"""The pages drawn from committed real-model results beside the atlas: Gu et al.'s sink-rate
table (docs/results/sink_protocol) and the secondary-sink and dormant-head pages
(docs/results/census): every committed model on its page with the numbers its JSON holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from docs.build.findings import dormant_heads_page, secondary_sinks_page, sink_protocol_page
from docs.build.results import census_extract
from mechsink.experiments.sink_protocol import PAPER_ROWS, percent, rate
from mechsink.inputs.prompts import SUITES

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
PROTOCOL_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-0.5b", "qwen2.5-1.5b")
CENSUS_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-0.5b")


def _load(folder: str) -> dict[str, dict]:
    files = sorted((RESULTS / folder).glob("*.json"))
    return {json.loads(f.read_text())["model"]: json.loads(f.read_text()) for f in files}


def test_the_protocol_table_holds_every_real_model_at_paper_settings():
    results = _load("sink_protocol")
    assert set(results) == set(PROTOCOL_MODELS)
    page = sink_protocol_page(results)
    for d in results.values():
        assert d["settings"]["n"] >= 32 and d["settings"]["seq_len"] == 64
        assert d["settings"]["eps"] == 0.3
        for suite in SUITES:
            iv = rate(d, suite, "nobos")
            assert iv["low"] <= iv["mean"] <= iv["high"] and iv["n"] == d["settings"]["n"]
            assert percent(iv) in page
    for name in PAPER_ROWS:
        assert f"{name} (paper)" in page


def test_the_census_pages_hold_every_model_with_its_numbers():
    results = _load("census")
    assert set(results) == set(CENSUS_MODELS)
    secondary, dormant = secondary_sinks_page(results), dormant_heads_page(results)
    for model, d in results.items():
        run = d["runs"][0]
        assert (run["n"], run["seq_len"]) == (32, 64)
        assert f"`{model}`" in secondary and f"`{model}`" in dormant
        assert f"| {run['secondary_sinks']['count']} |" in secondary
        assert f"| {run['value_share']['sink_heads']} |" in dormant


@pytest.fixture(scope="module")
def tiny_census():
    from mechsink.measure.census import census
    from mechsink.model import load_model

    model = load_model("organism:bb-gpt2-tiny")
    return census(model, ["natural"], ["bos"], n=4, seq_len=16).to_dict()


def test_the_extract_keeps_what_the_pages_read(tiny_census):
    d = census_extract(tiny_census, "mechsink scan x")
    run, full = d["runs"][0], tiny_census["runs"][0]
    assert d["model"] == tiny_census["model"] and d["command"] == "mechsink scan x"
    assert run["sink_rate"] == full["sink_rate"]
    assert run["secondary_sinks"]["count"] == full["secondary_sinks"]["count"]
    assert "top_score" not in run["secondary_sinks"]
    assert run["value_share"]["sink_heads"] == len(full["sink_heads_value_share"])
    assert run["value_share"]["dormant_share"] == full["sink_heads_dormant_share"]
    assert len(json.dumps(d)) < len(json.dumps(full))


def test_tokens_are_shown_as_code_never_as_html():
    """A token such as Gemma's ``<bos>`` (or a hostile one) is a code span on the pages."""
    from docs.build.findings import _token

    assert _token("<bos>") == "`<bos>`"
    assert _token("`<script>`") == "`'<script>'`"
    assert _token("a|b") == "`a\\|b`" and _token("a|b", table=False) == "`a|b`"
    page = sink_protocol_page(_load("sink_protocol"))
    assert "`gemma3-270m` `<bos>`" in page


def test_the_streaming_page_holds_every_model_and_setting():
    from docs.build.findings import streaming_page
    from docs.build.tables import fmt

    results = {f.stem: json.loads(f.read_text())
               for f in sorted((RESULTS / "streaming").glob("*.json"))}
    assert set(results) == set(CENSUS_MODELS)
    page = streaming_page(results)
    for model, d in results.items():
        assert d["schema"] == "mechsink-streaming/1" and f"## `{model}`" in page
        removed = d["circuit_removed"]["table"]
        for s in d["sinks"]:
            row = " | ".join(f"{fmt(d['perplexity'][str(s)][str(w)])} / "
                             f"{fmt(removed[str(s)][str(w)])}" for w in d["windows"])
            assert f"| {s} | {row} |" in page


def test_a_circuit_description_shows_neuron_counts_not_lists():
    from docs.build.findings import _neuron_counts

    text = "channel 5: zeroed neurons (MLP 1: [83, 12, 9]; MLP 2: [90]) at positions [0]"
    assert _neuron_counts(text) == ("channel 5: zeroed neurons (MLP 1: 3 neurons; MLP 2: "
                                    "1 neuron) at positions [0]")
