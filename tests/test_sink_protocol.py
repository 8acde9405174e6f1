"""Gu et al.'s sink-rate protocol: the rates against attention patterns read by hand from
TransformerLens's own cache, the variants a tokenizer allows, the table and its bad input."""

from __future__ import annotations

import math

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.experiments import get_experiment
from mechsink.experiments.sink_protocol import PAPER_ROWS, rate, run, table_lines
from mechsink.inputs.prompts import SUITES, make_prompts
from mechsink.interventions.stats import t_interval
from mechsink.model import act_name, load_model


@pytest.fixture(scope="module")
def organism():
    return load_model("organism:bb-gpt2-tiny")


def _by_hand(model, suite: str, variant: str, n: int, seq_len: int, eps: float,
             include_self: bool) -> torch.Tensor:
    """Per-sequence sink rates at key 0 from the patterns ``run_with_cache`` returns."""
    tokens = make_prompts(model, suite, variant, n=n, seq_len=seq_len, seed=0).tokens
    names = [act_name("pattern", layer) for layer in range(model.cfg.n_layers)]
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    first = 0 if include_self else 1
    alpha = torch.stack([cache[name][:, :, first:, 0].mean(-1) for name in names], 1)
    return (alpha > eps).double().mean(dim=(1, 2))  # [batch]: share of (layer, head)


def test_rates_equal_a_hand_count_from_the_cache(organism):
    result = run(organism, model_name="organism:bb-gpt2-tiny", n=6, seq_len=12, eps=0.3)
    d = result.data
    assert d["schema"] == "mechsink-sink-protocol/1"
    assert {(r["suite"], r["variant"]) for r in d["rows"]} == {
        (s, v) for s in SUITES for v in ("bos", "nobos")}
    for suite in SUITES:
        for variant in ("bos", "nobos"):
            for key, own in (("sink_rate", True), ("sink_rate_no_self", False)):
                hand = _by_hand(organism, suite, variant, 6, 12, 0.3, own)
                got = rate(d, suite, variant, key)
                assert math.isclose(got["mean"], float(hand.mean()), abs_tol=1e-6)
                want = t_interval(hand)  # below 64 sequences: Student's t
                assert math.isclose(got["low"], want.low, abs_tol=1e-6)
                assert got["n"] == 6
    # the organism has sinks on natural text with BOS (a rate the table is about)
    assert rate(d, "natural", "bos")["mean"] > 0.0
    assert "GPT2-XL (paper)" in result.summary()


def test_a_tokenizer_without_bos_gets_the_no_bos_rows_only(organism, monkeypatch):
    import mechsink.experiments.sink_protocol as sp

    monkeypatch.setattr(sp, "bos_token_id", lambda model: None)
    d = run(organism, n=2, seq_len=6).data
    assert {r["variant"] for r in d["rows"]} == {"nobos"}
    assert d["settings"]["bos_token"] is None
    lines = table_lines({"m": d})
    assert sum("`m`" in line for line in lines) == 1
    assert sum("(paper)" in line for line in lines) == len(PAPER_ROWS)


@pytest.mark.parametrize("settings, message", [({"n": 0}, "n"), ({"eps": 1.5}, "eps"),
                                               ({"seq_len": 10**6}, "context")])
def test_bad_settings_are_refused_before_any_forward(organism, settings, message):
    with pytest.raises(BadInputError, match=message):
        run(organism, **settings)


def test_the_command_line_knows_it():
    exp = get_experiment("sink_protocol")
    assert exp.needs_model and set(exp.settings()) >= {"n", "seq_len", "eps", "batch_size"}
    assert exp.parse_settings(["--n", "8", "--seq-len", "32"]) == {"n": 8, "seq_len": 32}
