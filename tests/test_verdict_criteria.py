"""Verdicts judged against the original effect, not against zero (the sink atlas's criteria)."""

from __future__ import annotations

from mechsink.experiments.structural_origin import move_verdict


def _row(k_before: float, k_after: float, zero_before: float, zero_after: float) -> dict:
    return {"k": 5, "intervention": "self-only mask", "sink_at_k_before": k_before,
            "sink_at_k_after": k_after, "sink_at_0_before": zero_before,
            "sink_at_0_after": zero_after}


def test_a_rise_at_k_that_leaves_position_0_the_sink_is_only_partial():
    # the case that was called "supported": k 0.048 -> 0.105 while position 0 still holds 0.48
    v = move_verdict([_row(0.048, 0.105, 0.52, 0.48)])
    assert v["verdict"] == "partial"
    assert "0.048 -> 0.105" in v["evidence"] and "0.520 -> 0.480" in v["evidence"]


def test_a_moved_sink_holds_half_the_original_and_beats_position_0():
    assert move_verdict([_row(0.05, 0.40, 0.60, 0.20)])["verdict"] == "supported"
    # half the original but position 0 still higher: not moved
    assert move_verdict([_row(0.05, 0.31, 0.60, 0.35)])["verdict"] == "partial"


def test_no_change_is_not_supported_and_the_criterion_is_written_out():
    v = move_verdict([_row(0.05, 0.06, 0.60, 0.59)])
    assert v["verdict"] == "not supported"
    assert "half the sink score position 0 had before" in v["criterion"]
    assert move_verdict([])["verdict"] == "not supported"


def test_a_degenerate_interval_says_why():
    import torch

    from mechsink.interventions.stats import bootstrap_interval

    same = bootstrap_interval(torch.full((8,), 3.5))
    assert same.low == same.high == 3.5
    assert "same value" in same.to_dict()["note"] and "same value" in str(same)
    assert "one prompt" in bootstrap_interval([1.0]).note
    spread = bootstrap_interval(torch.arange(8.0))
    assert spread.note is None and "note" not in spread.to_dict()
