"""The Python API reads the CLI's metric strings exactly as the CLI does (one parser)."""

from __future__ import annotations

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.patching import MassiveValue, activation_patch


def test_activation_patch_takes_a_metric_string(gpt2_tiny):
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(100, 5000, (2, 6), generator=gen)
    corrupted = torch.randint(100, 5000, (2, 6), generator=gen)
    clean[:, 0] = corrupted[:, 0] = 50256
    by_string = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre",
                                 "massive_value:1:0:5", prepend_bos=False)
    by_object = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre",
                                 MassiveValue(1, 0, 5), prepend_bos=False)
    assert torch.equal(by_string.values, by_object.values)
    with pytest.raises(BadInputError, match="massive_value"):
        activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", "massive_value:1:0",
                         prepend_bos=False)


def test_a_non_finite_patch_value_round_trips_as_nan(tmp_path):
    import json
    import math

    from mechsink.patching import PatchResult

    r = PatchResult(values=torch.tensor([[0.5, float("nan")]], dtype=torch.float64),
                    axes=("layer", "pos"), labels={"layer": [0], "pos": [0, 1]}, site="resid_pre",
                    metric="m", clean_value=1.0, corrupted_value=0.0, tokens=[], meta={})
    path = r.to_json(tmp_path / "r.json")
    text = path.read_text()
    def no_literal(name):
        raise AssertionError(f"non-strict JSON literal {name}")

    assert json.loads(text, parse_constant=no_literal)["values"][0][1] is None
    back = PatchResult.from_json(path)
    assert back.values[0, 0] == 0.5 and math.isnan(float(back.values[0, 1]))


def test_a_bare_logit_diff_string_costs_the_forwards_of_the_metric_it_means(
        gpt2_tiny, monkeypatch, request):
    """"logit_diff" from the API is parsed once and reads the clean and corrupted runs'
    predicted tokens off the runs patching records: as many forwards as LogitDiff(a, b) given
    directly, the same values; what the metric reads is worked out once per call."""
    from mechsink.model import to_tokens
    from mechsink.patching import LogitDiff, engine, metrics

    clean, corrupted = "The cat sat on the mat", "The dog ran to the car"
    calls = {"forward": 0, "parse": 0, "needs": 0}
    real_parse, real_needs = metrics.parse_metric, engine.resolve_needs

    def counted_parse(*args, **kwargs):
        calls["parse"] += 1
        return real_parse(*args, **kwargs)

    def counted_needs(*args, **kwargs):
        calls["needs"] += 1
        return real_needs(*args, **kwargs)

    monkeypatch.setattr(metrics, "parse_metric", counted_parse)
    monkeypatch.setattr(engine, "resolve_needs", counted_needs)
    with torch.no_grad():
        correct, incorrect = (int(gpt2_tiny(to_tokens(gpt2_tiny, t, prepend_bos=True))[0, -1]
                                  .argmax()) for t in (clean, corrupted))
    assert correct != incorrect
    handle = gpt2_tiny.blocks[0].register_forward_pre_hook(
        lambda *_: calls.__setitem__("forward", calls["forward"] + 1))
    request.addfinalizer(handle.remove)  # the model is the session's
    given = LogitDiff(correct, incorrect)
    for site in ("resid_pre", "z"):
        activation_patch(gpt2_tiny, clean, corrupted, site, given, prepend_bos=True)  # warm
        counted = {}
        for label, metric in (("string", "logit_diff"), ("object", given)):
            calls.update(forward=0, parse=0, needs=0)
            counted[label] = (activation_patch(gpt2_tiny, clean, corrupted, site, metric,
                                               prepend_bos=True), dict(calls))
        (by_string, on_string), (by_object, on_object) = counted["string"], counted["object"]
        assert on_string["forward"] == on_object["forward"] > 0, (site, counted)
        assert on_string["parse"] == 1 and on_object["parse"] == 0
        assert on_string["needs"] == on_object["needs"] == 1
        assert torch.equal(by_string.values, by_object.values), site
        assert (by_string.clean_value, by_string.corrupted_value) == (
            by_object.clean_value, by_object.corrupted_value)
    # the predicted tokens are the same ones: identical prompts predict one token, refused
    with pytest.raises(BadInputError, match="predict the same next token"):
        activation_patch(gpt2_tiny, clean, clean, "resid_pre", "logit_diff", prepend_bos=True)


def test_a_bare_logit_diff_is_parsed_without_a_forward_and_bound_from_both_runs(gpt2_tiny):
    """parse_metric("logit_diff") is a LogitDiff whose tokens the patching runs fill in: read
    before binding, or under an ablation (no corrupted prompt), it refuses in one line."""
    from mechsink.model import to_tokens
    from mechsink.patching import LogitDiff, parse_metric
    from mechsink.patching.metrics import Outputs

    clean = to_tokens(gpt2_tiny, "The cat sat on the mat", prepend_bos=True)
    bare = parse_metric("logit_diff", gpt2_tiny, clean, clean)
    assert isinstance(bare, LogitDiff) and repr(bare) == "LogitDiff.predicted()"
    assert bare.correct is None and bare.name == "logit_diff"
    out = Outputs(6, logits=torch.zeros(1, 6, 8))
    with pytest.raises(BadInputError, match="use it through activation_patch"):
        bare(out)
    with pytest.raises(BadInputError, match="needs the clean and corrupted prompts"):
        bare.bind_runs(out, None)
    with pytest.raises(BadInputError, match="needs the clean and corrupted prompts"):
        parse_metric("logit_diff", gpt2_tiny, clean, None)
    logits = torch.zeros(1, 6, 8)
    other = logits.clone()
    logits[0, -1, 3], other[0, -1, 5] = 1.0, 1.0
    bound = bare.bind_runs(Outputs(6, logits=logits), Outputs(6, logits=other))
    assert (bound.correct, bound.incorrect) == (3, 5)
    assert float(bound(Outputs(6, logits=logits))) == 1.0
