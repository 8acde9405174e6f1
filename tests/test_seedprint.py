"""Init-time structure and the SeedPrint identity test."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from mechsink import load_model
from mechsink.errors import BadInputError
from mechsink.measure.seedprint import (
    contraction_direction,
    explained_fraction,
    init_model,
    last_logits,
    random_tokens,
    seedprint_test,
    token_preference,
)
from mechsink.model import hf_model_of
from mechsink.training.loop import Recipe, train

TINY = Recipe("sp-tiny", "llama", n_layers=1, d_model=32, n_heads=2, data="bigram-backcopy",
              seq_len=16, batch_size=8, steps=30, lr=3e-3, warmup=5)


@pytest.mark.parametrize("scheme,expected_std", [
    ("hf", 0.02), ("tl-legacy", 0.8 / math.sqrt(64)), ("torch", 1 / math.sqrt(3 * 64)),
])
def test_init_schemes_set_the_documented_scale(scheme, expected_std):
    model = init_model("llama-tiny", seed=0, scheme=scheme)
    weight = hf_model_of(model).model.layers[0].self_attn.q_proj.weight  # fan_in = d_model = 64
    assert weight.std().item() == pytest.approx(expected_std, rel=0.05)


def test_init_model_rejects_unknown_scheme():
    with pytest.raises(BadInputError, match="init scheme"):
        init_model("gpt2-tiny", seed=0, scheme="xavier")


def test_token_preference_on_planted_logits():
    logits = torch.zeros(10, 5)
    logits[:, 3] = math.log(8.0)  # p(3) = 8/12, the others 1/12 each
    pref = token_preference(logits)
    assert pref.top_token == 3
    assert pref.ratio == pytest.approx(8.0)
    assert pref.max_prob == pytest.approx(8 / 12)


def test_contraction_direction_finds_the_planted_direction():
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(16, generator=gen)
    u = u / u.norm()
    states = 5.0 * u + 0.1 * torch.randn(200, 16, generator=gen)
    direction = contraction_direction(states)
    assert torch.dot(direction, u).item() > 0.999
    assert explained_fraction(states, direction) > 0.99


def _organisms(tmp_path, step):
    runs = {}
    for init, data in itertools.product((0, 1), (0, 1)):
        out = tmp_path / f"i{init}d{data}"
        if not out.exists():
            train(TINY, out, seed=init, data_seed=data, progress=False)
        runs[init, data] = load_model(f"organism:{out / f'step-{step}'}", device="cpu")
    return runs


def _pair_results(runs):
    tokens = random_tokens(runs[0, 0], n=64, seq_len=16, seed=7)
    logits = {key: last_logits(model, tokens) for key, model in runs.items()}
    return {(a, b): seedprint_test(logits[a], logits[b], k=32)
            for a, b in itertools.combinations(runs, 2)}


def test_seedprint_separates_shared_from_different_initialisations(tmp_path):
    """Organisms (init seed, data seed): twins share an init and see different data."""
    at_init = _pair_results(_organisms(tmp_path, step=0))
    for (a, b), result in at_init.items():  # untrained: the plain p-value rule is exact
        assert result.same_seed() == (a[0] == b[0]), (a, b, result)
    trained = _pair_results(_organisms(tmp_path, step=30))
    same = [r.z for (a, b), r in trained.items() if a[0] == b[0]]
    different = [r.z for (a, b), r in trained.items() if a[0] != b[0]]
    # After training on one task, unrelated models correlate too (z of a few units); models
    # that share an initialisation still stand far above them.
    assert min(same) > 2 * max(different), (same, different)


def test_calibrated_threshold_is_the_normal_quantile_of_the_null():
    from statistics import NormalDist, fmean, stdev

    from mechsink.measure.seedprint import calibrate_threshold

    null = [1.0, 2.0, 3.0, 4.0, 5.0]
    cal = calibrate_threshold(null, alpha=0.01)
    assert cal.threshold == pytest.approx(fmean(null) + NormalDist().inv_cdf(0.99) * stdev(null))
    # a null maximum above the fitted quantile is the floor of the threshold
    heavy = [0.0] * 9 + [50.0]
    assert calibrate_threshold(heavy, alpha=0.2).threshold == pytest.approx(50.0)
    with pytest.raises(BadInputError, match="null pairs"):
        calibrate_threshold([1.0, 2.0])


@pytest.mark.parametrize("errors,n", [(0, 12), (3, 12), (12, 12), (1, 4)])
def test_error_rate_interval_is_clopper_pearson(errors, n):
    from scipy.stats import binomtest

    from mechsink.measure.seedprint import error_rate

    got = error_rate(errors, n)
    ci = binomtest(errors, n).proportion_ci(confidence_level=0.95, method="exact")
    assert got["rate"] == errors / n
    assert (got["low"], got["high"]) == (pytest.approx(ci.low, abs=1e-9),
                                         pytest.approx(ci.high, abs=1e-9))


def test_seedprint_calibration_on_tiny_organisms(tmp_path):
    from mechsink.experiments.seedprint import calibration_lines, seedprint_calibration

    cal = seedprint_calibration(tmp_path, TINY, steps=4, null_inits=3, held_out_inits=2, k=8)
    assert len(cal["null_z"]) == 3 and cal["calibration"]["threshold"] >= max(cal["null_z"])
    pairs = cal["pairs"]  # 4 held-out organisms: 2 pairs share an init, 4 do not
    assert sum(p["same_init"] for p in pairs) == 2 and len(pairs) == 6
    for p in pairs:
        assert p["calibrated"] == (p["z"] > cal["calibration"]["threshold"])
        assert p["paper_rule"] == (p["p_value"] < 0.01 and p["z"] > 0)
        assert p["calibrated_tau"] == (p["mean_tau"] > cal["calibration_tau"]["threshold"])
    fp = cal["calibrated"]["false_positive"]
    assert fp["n"] == 4 and fp["errors"] == sum(p["calibrated"] for p in pairs
                                               if not p["same_init"])
    assert fp["low"] <= fp["rate"] <= fp["high"]
    assert "calibrated: z >" in "\n".join(calibration_lines(cal))
