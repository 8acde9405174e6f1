"""mechsink.interventions.chain on a two-layer Llama whose weights are set by hand.

The planted circuit: token 1 ("BOS") carries a detector channel; three MLP-0 neurons read it and
write channel 2 at position 0 (shares 70%, 27%, 3% of the write), and head 0 of layer 1 reads
channel 2 as its key with a constant query. Every expected number is computed here by hand
(RMSNorm, SiLU, rotary angle, softmax written out), independently of mechsink.
"""

from __future__ import annotations

import math

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.interventions import chain
from mechsink.interventions.edits import applied
from mechsink.measure import super_neuron_sets
from mechsink.measure.cache import hook_names
from mechsink.model import act_name, down_projection, wrap_hf

D, HD, N_POS = 16, 8, 16
N_PROMPTS = 8  # MIN_N_APART: the fewest prompts a set-validation verdict is called on
CONST, DET, MASSIVE, BULK = 0, 1, 2, 15
NEURONS, SHARES = (3, 5, 6), (0.70, 0.27, 0.03)
G = 3000.0  # gate and up weights on the detector channel
W_SCALE = 2.0  # down_proj weight scale: channel 2 gets about 2 x 900
BULK_VALUE = 800.0  # a large channel at position 0 no head reads (keeps RMSNorm from saturating)
QA, KB = 1.0, 2.0  # query weight on the constant channel, key weight on channel 2
THETA = 1e6
EPS_NORM = 1e-6


def _build():
    from transformers import LlamaConfig

    from mechsink.model.zoo import gpt2_tokenizer, seeded_model

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=D, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=8, vocab_size=50257,
                      max_position_embeddings=64, rope_theta=THETA, rms_norm_eps=EPS_NORM,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=1)
    hf = seeded_model(cfg, 0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.zero_()
        for name, p in hf.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.fill_(1.0)
        emb = hf.model.embed_tokens.weight
        emb[:, CONST] = 1.0
        for t in range(2, 50257):
            emb[t, 3 + t % 12] = 1.0  # content: one of channels 3..14, same norm for all
        emb[1, DET] = 1.0
        emb[1, BULK] = BULK_VALUE
        mlp = hf.model.layers[0].mlp
        for n, share in zip(NEURONS, SHARES, strict=True):
            mlp.gate_proj.weight[n, DET] = G
            mlp.up_proj.weight[n, DET] = G
            mlp.down_proj.weight[MASSIVE, n] = W_SCALE * share
        attn = hf.model.layers[1].self_attn
        attn.q_proj.weight[3, CONST] = QA  # head 0, dim 3 (the slowest rotary pair)
        attn.k_proj.weight[3, MASSIVE] = KB
        attn.v_proj.weight[:, 3:15] = torch.eye(HD * 2, 12)
        attn.o_proj.weight[3:15, :] = torch.eye(12, HD * 2)
        hf.lm_head.weight.normal_(generator=torch.Generator().manual_seed(1))
    return wrap_hf(hf, gpt2_tokenizer(), name="planted-llama")


@pytest.fixture(scope="module")
def planted():
    return _build()


@pytest.fixture(scope="module")
def tokens():
    gen = torch.Generator().manual_seed(0)
    body = torch.randint(2, 200, (N_PROMPTS, N_POS - 1), generator=gen)
    return torch.cat([torch.ones(N_PROMPTS, 1, dtype=torch.long), body], 1)


# --- the hand computation ----------------------------------------------------------------------


def _silu(x: float) -> float:
    return x / (1.0 + math.exp(-x))


def _post() -> float:
    """Each planted neuron's input at position 0: silu(G x_det) * G x_det after RMSNorm."""
    rms = math.sqrt((1.0 + 1.0 + BULK_VALUE**2) / D + EPS_NORM)
    det = 1.0 / rms
    return _silu(G * det) * G * det


def _channel(factor: float) -> float:
    """Channel 2 at position 0 after block 0 when neurons 3 and 5 are scaled by ``factor``."""
    p = _post()
    return p * W_SCALE * (factor * (SHARES[0] + SHARES[1]) + SHARES[2])


def _gu_score(channel: float) -> float:
    """Gu's sink score of L1H0 at key 0 given channel 2 at position 0 (hand softmax)."""
    rms0 = math.sqrt((1.0 + 1.0 + BULK_VALUE**2 + channel**2) / D + EPS_NORM)
    k0 = KB * channel / rms0
    q = QA / math.sqrt(2.0 / D + EPS_NORM)  # every later token: const + one content channel
    omega = THETA ** (-(2 * 3) / HD)  # pair 3 of the rotary embedding
    rows = [1.0]
    for i in range(1, N_POS):
        z = q * k0 * math.cos(i * omega) / math.sqrt(HD)
        rows.append(math.exp(z) / (math.exp(z) + i))
    return sum(rows) / N_POS


def _expected_half_dose() -> float:
    floor, clean = _gu_score(_channel(0.0)), _gu_score(_channel(1.0))
    half = (floor + clean) / 2
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _gu_score(_channel(mid)) < half else (lo, mid)
    return (lo + hi) / 2


# --- tests ---------------------------------------------------------------------------------------


def test_the_planted_model_computes_what_the_hand_computation_says(planted, tokens):
    r = chain.measure(planted, tokens, channels=[MASSIVE])
    assert r.channels[:, 0, 0] == pytest.approx(torch.full((N_PROMPTS,), _channel(1.0)), rel=1e-4)
    assert r.scores[:, 1, 0] == pytest.approx(torch.full((N_PROMPTS,), _gu_score(_channel(1.0))),
                                              abs=1e-5)


def test_complete_set_equals_the_planted_set(planted, tokens):
    _, cache = planted.run_with_cache(tokens, names_filter=hook_names(
        2, ["mlp.hook_post", "hook_mlp_out", "hook_resid_post"]))
    found = super_neuron_sets(cache, down_projection(planted))
    # BULK is massive too (the layer's median |x| is tiny here) but no MLP writes it: no set
    assert found.massive_channels() == [MASSIVE, BULK]
    (s,) = found.sets()
    assert (s.layer, s.channel) == (0, MASSIVE)
    assert s.units == [3, 5]  # 70% + 27% >= 95%; the 3% neuron is left out
    assert s.explained == pytest.approx(0.97, abs=1e-4)
    assert {n.neuron for n in found.spiking_neurons()} == set(NEURONS)


def test_dose_response_recovers_the_planted_threshold(planted, tokens):
    doses = [round(0.025 * i, 3) for i in range(41)] + [1.5, 2.0]
    target = chain.neuron_set(planted, 0, [3, 5], channels=[MASSIVE])
    dr = chain.dose_response(planted, tokens, target, doses, n_boot=200)
    assert dr.frame.sink_heads == ((1, 0),)
    assert dr.frame.late_layers == (1,)
    for d, row in zip(dr.doses, dr.rows, strict=True):
        assert row.channel.mean == pytest.approx(_channel(d), rel=1e-4)
        assert row.late_sink_score.mean == pytest.approx(_gu_score(_channel(d)), abs=1e-5)
        # identical prompts at position 0: the interval is a point
        assert row.late_sink_score.high - row.late_sink_score.low < 1e-6
    expected = _expected_half_dose()
    assert 0.05 < expected < 0.95  # the planted threshold lies inside the grid
    assert dr.half_effect.dose == pytest.approx(expected, abs=0.01)
    assert dr.half_effect.channel == pytest.approx(_channel(expected), rel=0.02)
    # the default grid reaches full removal and beyond
    assert chain.DEFAULT_DOSES[0] == 0.0 and chain.DEFAULT_DOSES[-1] == 3.0


def test_channel_surgery_sets_the_median_of_later_positions(planted, tokens):
    edits = chain.channel_surgery(planted, [MASSIVE], 1)
    name = act_name("resid_pre", 1)
    with applied(planted, edits):
        _, cache = planted.run_with_cache(tokens, names_filter=[name])
    assert cache[name][:, 0, MASSIVE].abs().max() < 1e-6  # later positions carry 0 there
    r = chain.measure(planted, tokens, edits, channels=[MASSIVE])
    assert r.scores[:, 1, 0] == pytest.approx(torch.full((N_PROMPTS,), _gu_score(0.0)), abs=1e-5)
    # the direction version with the channel's own axis does the same
    u = torch.zeros(D)
    u[MASSIVE] = 1.0
    r2 = chain.measure(planted, tokens, chain.direction_surgery(planted, u, 1),
                       channels=[MASSIVE])
    assert torch.allclose(r2.scores, r.scores, atol=1e-6)
    # x_0 entering block 1 is the same in every prompt: the top direction is x_0 / |x_0|
    x0 = torch.zeros(D)
    x0[[CONST, DET, BULK, MASSIVE]] = torch.tensor([1.0, 1.0, BULK_VALUE, _channel(1.0)])
    assert torch.allclose(chain.top_direction(planted, tokens, 1), x0 / x0.norm(), atol=1e-5)


def test_scaling_a_residual_channel_and_its_direction_agree(planted, tokens):
    u = torch.zeros(D)
    u[MASSIVE] = 1.0
    a = chain.measure(planted, tokens, chain.channel_set(planted, [MASSIVE], [1]).edits(0.3))
    b = chain.measure(planted, tokens, chain.direction_set(planted, u, [1]).edits(0.3))
    assert a.scores[:, 1, 0] == pytest.approx(
        torch.full((N_PROMPTS,), _gu_score(0.3 * _channel(1.0))), abs=1e-5)
    assert torch.allclose(a.scores, b.scores, atol=1e-6)


def test_key_logit_parts_sum_to_the_logit(planted, tokens):
    split = chain.key_logit_split(planted, tokens, 1, 0, [MASSIVE], other_key=4)
    k0, kj = split.sink_key, split.other_key
    parts = k0.massive + k0.rest + k0.key_bias + k0.rotary
    assert parts == pytest.approx(k0.model, abs=1e-4)
    assert k0.max_error < 1e-4
    # by hand: the unrotated q . k_0 of the massive channel, averaged over queries 4..15
    rms0 = math.sqrt((2.0 + BULK_VALUE**2 + _channel(1.0) ** 2) / D + EPS_NORM)
    q = QA / math.sqrt(2.0 / D + EPS_NORM)
    assert k0.massive == pytest.approx(q * KB * _channel(1.0) / rms0 / math.sqrt(HD), rel=1e-4)
    assert abs(k0.rest) < 1e-6 and k0.key_bias == 0.0
    assert abs(k0.rotary) < 1e-3 * abs(k0.massive)  # the slowest rotary pair barely turns
    assert kj.model == pytest.approx(0.0, abs=1e-6)
    assert kj.massive + kj.rest + kj.key_bias + kj.rotary == pytest.approx(kj.model, abs=1e-4)


def test_key_logit_parts_on_a_model_with_key_bias_and_no_rotation(gpt2_tiny):
    tokens = torch.randint(0, 1000, (3, 12), generator=torch.Generator().manual_seed(0))
    split = chain.key_logit_split(gpt2_tiny, tokens, 1, 2, [5, 9])
    for p in (split.sink_key, split.other_key):
        assert abs(p.rotary) < 1e-5  # absolute positions: nothing is rotated
        assert p.massive + p.rest + p.key_bias == pytest.approx(p.model, abs=1e-4)


def test_bootstrap_interval_covers_the_true_mean_about_95_percent():
    gen = torch.Generator().manual_seed(0)
    hits, reps = 0, 300
    for r in range(reps):
        sample = torch.randn(40, generator=gen, dtype=torch.float64) * 2.0 + 1.0
        ci = chain.bootstrap_interval(sample, n_boot=400, seed=r)
        hits += ci.low <= 1.0 <= ci.high
    assert 0.89 <= hits / reps <= 0.99


def test_half_effect_dose_interpolates_and_needs_the_ends():
    dose, ch = chain.half_effect_dose([0.0, 0.5, 1.0], [0.0, 0.2, 1.0], [0.0, 10.0, 20.0])
    assert dose == pytest.approx(0.5 + 0.5 * (0.5 - 0.2) / 0.8)
    assert ch == pytest.approx(10.0 + 10.0 * (0.5 - 0.2) / 0.8)
    with pytest.raises(BadInputError, match="must contain 0"):
        chain.half_effect_dose([0.5, 1.0], [0.2, 1.0])
    assert chain.half_effect_dose([0.0, 1.0], [0.2, 1.0]) == (None, None)  # nothing between


def test_bad_input_is_refused_before_work(planted, tokens):
    with pytest.raises(BadInputError, match="doses must contain 0"):
        chain.dose_response(planted, tokens, chain.neuron_set(planted, 0, [3]), [0.5, 1.0])
    with pytest.raises(BadInputError, match="out of range"):
        chain.neuron_set(planted, 0, [99])
    with pytest.raises(BadInputError, match="channels"):
        chain.channel_surgery(planted, [D], 0)
    with pytest.raises(BadInputError, match="out of range"):
        chain.key_logit_split(planted, tokens, 5, 0, [MASSIVE])


@pytest.mark.slow
def test_smollm2_complete_set_has_several_neurons_and_its_removal_moves_the_sink(smollm2):
    """SmolLM2's massive channel 507 appears in block 11 (measured: 29 -> 24,900 at position 0),
    written by more than one neuron; removing the whole set lowers Gu's sink rate."""
    from mechsink.inputs.prompts import make_prompts
    from mechsink.interventions.readout import massive_channel_sets

    tokens = make_prompts(smollm2, "natural", "bos", n=4, seq_len=32).tokens
    found = massive_channel_sets(smollm2, tokens)
    assert (found.channel, found.creating_layer) == (507, 11)
    complete = found.sets[11]
    assert len(complete.units) > 1 and complete.explained >= 0.95
    assert complete.units[0] == 1229  # the single super neuron the census always found
    dr = chain.dose_response(smollm2, tokens, chain.neuron_set(smollm2, 11, complete.units,
                                                               channels=[507]), [0.0, 1.0])
    off, on = dr.row(0.0), dr.row(1.0)
    assert off.sink_rate.high < on.sink_rate.low  # intervals apart, downwards
    assert abs(off.channel.mean) < 0.1 * abs(on.channel.mean)


def test_validate_sets_zeroes_the_set_and_a_random_twin_as_the_hand_computation(planted,
                                                                                tokens):
    from mechsink.interventions.set_validation import random_units, validate_sets

    _, cache = planted.run_with_cache(tokens, names_filter=hook_names(
        2, ["mlp.hook_post", "hook_mlp_out", "hook_resid_post"]))
    (s,) = super_neuron_sets(cache, down_projection(planted)).sets()
    v = validate_sets(planted, tokens, [s], n_boot=200)
    (c,) = v.checks
    assert (c.layer, c.channel, c.units) == (0, MASSIVE, (3, 5))
    assert len(c.random_units) == 2 and not set(c.random_units) & {3, 5}
    assert c.random_units == random_units(8, 2, [3, 5], 0)  # seed + layer 0: reproducible
    kept = SHARES[2] if 6 not in c.random_units else 0.0
    random_channel = _post() * W_SCALE * (SHARES[0] + SHARES[1] + kept)
    assert v.clean[MASSIVE].channel.mean == pytest.approx(_channel(1.0), rel=1e-4)
    assert c.zeroed.channel.mean == pytest.approx(_channel(0.0), rel=1e-4)
    assert c.random.channel.mean == pytest.approx(random_channel, rel=1e-4)
    clean, off = _gu_score(_channel(1.0)), _gu_score(_channel(0.0))
    rand = _gu_score(random_channel)
    assert c.zeroed.late_sink_score.mean == pytest.approx(off, abs=1e-5)
    assert c.random.late_sink_score.mean == pytest.approx(rand, abs=1e-5)
    assert c.sink_drop.mean == pytest.approx(clean - off, abs=1e-5)
    assert c.beyond_random.mean == pytest.approx(rand - off, abs=1e-5)
    expected = ("carries the sink" if off < 0.5 * clean else "moves the sink"
                if clean - off >= 0.1 * clean else "does not carry the sink")
    assert expected != "does not carry the sink"  # the planted set moves the sink
    assert c.verdict == expected and v.carrier == 0
    assert v.to_dict()["carrier_block"] == 0 and v.to_dict()["sets"][0]["verdict"] == expected


def test_the_census_says_which_block_carries_the_sink(planted, tokens):
    from mechsink.inputs.prompts import PromptSet
    from mechsink.interventions.set_validation import validate_sets
    from mechsink.jobs.census import census
    from mechsink.measure.census import census_json

    named: list[str] = []
    c = census(planted, prompts=[PromptSet("natural", "bos", tokens, 0)],
               progress=lambda name, *a: named.append(name), validate_sets=True)
    assert named[-1] == "validating super-neuron sets"  # the step is named while it runs
    field = c.to_dict()["super_neuron_causality"]
    assert field["run"] == "natural/bos" and field["carrier_block"] == 0
    (s,) = c.runs[0].super_sets.sets()
    direct = validate_sets(planted, tokens, [s]).to_dict()
    assert field["sets"] == direct["sets"]
    assert '"super_neuron_causality"' in census_json(c)
    off = census(planted, prompts=[PromptSet("natural", "bos", tokens, 0)],
                 progress=lambda *a: 0)  # off by default
    assert "super_neuron_causality" not in off.to_dict()


def test_the_census_says_why_no_set_could_be_validated(llama_tiny):
    from mechsink.jobs.census import census

    c = census(llama_tiny, ["random"], ["bos"], n=2, seq_len=8, progress=lambda *a: 0,
               validate_sets=True)
    assert set(c.to_dict()["super_neuron_causality"]) == {"not_applicable"}


def test_the_sets_check_runs_on_the_census_own_prompts_and_refuses_a_census_without_them(
        planted, tokens):
    """Each run keeps its input tokens (the check reruns exactly those prompts); a census whose
    runs lost them (built by hand, or from saved data) is refused, not checked on other text."""
    from dataclasses import replace

    from mechsink.inputs.prompts import PromptSet
    from mechsink.jobs.census import set_causality
    from mechsink.measure.census import census

    c = census(planted, prompts=[PromptSet("natural", "bos", tokens, 0)], progress=lambda *a: 0)
    assert torch.equal(c.runs[0].tokens, tokens) and "super_neuron_causality" not in c.to_dict()
    assert set_causality(planted, c)["carrier_block"] == 0
    bare = replace(c, runs=tuple(replace(r, tokens=None) for r in c.runs))
    with pytest.raises(BadInputError, match="needs the census's prompts"):
        set_causality(planted, bare)
