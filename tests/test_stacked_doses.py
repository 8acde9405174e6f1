"""The doses as stacked copies give what one forward per dose gives (tiny random models)."""

from __future__ import annotations

import pytest
import torch

from mechsink.experiments.structural_origin import move_the_sink
from mechsink.interventions import chain
from mechsink.interventions.edits import ablate, attend_only_to_self, scale_tokens
from mechsink.interventions.readout import measure, measure_each
from mechsink.interventions.stacked import SPEEDUPS


@pytest.fixture
def one_at_a_time():
    """Run the block with the stacked path switched off (the reference loop)."""
    def switch(on: bool) -> None:
        SPEEDUPS["stacked"] = on
    yield switch
    SPEEDUPS["stacked"] = True


def _tokens(model, n=5, seq_len=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, int(model.cfg.d_vocab), (n, seq_len), generator=gen)


@pytest.mark.parametrize("rows", [None, 7])  # 7: copies split across forwards and chunks
def test_stacked_readouts_equal_one_forward_per_edit_list(llama_tiny, rows, monkeypatch):
    from mechsink.interventions import stacked

    if rows is not None:
        monkeypatch.setattr(stacked, "ROWS_PER_FORWARD", rows)
    model, tokens = llama_tiny, _tokens(llama_tiny)
    lists = [[], [scale_tokens(model, 1, [3], 8.0)],
             attend_only_to_self(model, range(int(model.cfg.n_layers)), 4, strength=0.5),
             [ablate(model, "hook_resid_pre", 1, mode="set", value=5.0, units=[2],
                     positions=[6]), scale_tokens(model, 1, [6], 3.0)],
             chain.neuron_set(model, 0, [1, 2, 3]).edits(0.0)]
    got = measure_each(model, tokens, lists, channels=[2, 5], batch_size=2)
    for edits, r in zip(lists, got, strict=True):
        ref = measure(model, tokens, edits, channels=[2, 5], batch_size=2)
        torch.testing.assert_close(r.scores, ref.scores, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r.channels, ref.channels, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(r.loss, ref.loss, rtol=1e-5, atol=1e-5)
    # the edits changed something: the copies did not all read the clean run
    assert not torch.allclose(got[1].loss, got[0].loss)
    assert not torch.allclose(got[2].scores, got[0].scores)


def test_batched_dose_response_equals_the_loop(llama_tiny, one_at_a_time):
    model, tokens = llama_tiny, _tokens(llama_tiny, n=6)
    target = chain.neuron_set(model, 0, [0, 1, 2, 3], channels=[1])
    doses = (0.0, 0.5, 1.0, 2.0)
    batched = chain.dose_response(model, tokens, target, doses, batch_size=4)
    one_at_a_time(False)
    loop = chain.dose_response(model, tokens, target, doses, batch_size=4)
    for a, b in zip(batched.readouts, loop.readouts, strict=True):
        torch.testing.assert_close(a.scores, b.scores, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.channels, b.channels, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-5)
    assert batched.frame == loop.frame


def test_batched_move_the_sink_equals_the_loop(llama_tiny, one_at_a_time):
    model, tokens = llama_tiny, _tokens(llama_tiny, n=4, seq_len=10)
    sn = {"channel": 3, "layer": 0}
    kw = {"mask_strengths": (0.5, 1.0), "amplify_factors": (4.0, 64.0),
          "plant_factors": (1.0, 4.0), "batch_size": 3}
    rows, curves = move_the_sink(model, tokens, sn, [2, 5], **kw)
    one_at_a_time(False)
    ref_rows, ref_curves = move_the_sink(model, tokens, sn, [2, 5], **kw)
    assert len(rows) == len(ref_rows) == 2 * (2 + 2 + 2 + 2 + 2)
    for a, b in zip(rows, ref_rows, strict=True):
        assert (a["k"], a["intervention"], a["dose"]) == (b["k"], b["intervention"], b["dose"])
        for key in ("sink_at_k_after", "sink_at_0_after", "channel_at_k_after",
                    "rate_at_k_after"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
    for a, b in zip(curves, ref_curves, strict=True):
        assert a["sink_at_k"] == pytest.approx(b["sink_at_k"], rel=1e-5, abs=1e-6)
    # the doses did something: the norm amplified 64x leaves a larger channel at k than 4x
    norm = {(r["k"], r["dose"]): r["channel_at_k_after"] for r in rows
            if r["intervention"] == "norm amplified"}
    assert norm[(2, 64.0)] > 2 * norm[(2, 4.0)]


def test_sink_readout_each_equals_one_run_per_ablation(gpt2_tiny):
    from mechsink.experiments.p0_sink import component_edits
    from mechsink.interventions.readout import sink_readout, sink_readout_each

    model, tokens = gpt2_tiny, _tokens(gpt2_tiny, n=4, seq_len=9)
    lists = [component_edits(model, c) for c in ("L0H0", "L0H1", "MLP0", "L1H0")]
    got = sink_readout_each(model, tokens, lists, positions=[0, 2], include_self=False,
                            channel=3)
    for edits, r in zip(lists, got, strict=True):
        ref = sink_readout(model, tokens, edits, positions=[0, 2], include_self=False,
                           channel=3)
        for k in (0, 2):
            torch.testing.assert_close(r.scores[k], ref.scores[k], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(r.channel_values[k], ref.channel_values[k],
                                       rtol=1e-5, atol=1e-5)
            assert r.rates[k] == ref.rates[k]
    assert not torch.allclose(got[2].channel_values[2], got[0].channel_values[2])


def test_variance_part_in_one_run_equals_one_run_per_suite(llama_tiny, one_at_a_time,
                                                          monkeypatch):
    from mechsink.experiments.structural_origin import variance_part
    from mechsink.measure import forward

    together = variance_part(llama_tiny, 6, 12)
    one_at_a_time(False)
    alone = variance_part(llama_tiny, 6, 12)
    one_at_a_time(True)
    # a memory budget of 4 sequences: chunks of 4 rows, a suite's rows split across two
    monkeypatch.setattr(forward, "bytes_per_sequence", lambda *a: 1)
    monkeypatch.setattr(forward, "memory_budget_of", lambda model, budget=None: 4)
    chunked = variance_part(llama_tiny, 6, 12)
    for suite in ("random", "natural"):
        for key in ("ratio", "predicted_ratio"):
            assert together[suite][key] == pytest.approx(alone[suite][key], rel=1e-5)
            assert chunked[suite][key] == pytest.approx(alone[suite][key], rel=1e-5)
    assert together["random"]["ratio"] != together["natural"]["ratio"]
