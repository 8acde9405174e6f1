"""Faithfulness by a vanishing clean-to-empty gap: undefined within float noise (as activation
patching refuses to normalise), flagged when it is a small fraction of the metric's size."""

from __future__ import annotations

import math

import torch

from mechsink.discover import GraphRun, discover
from mechsink.discover.circuit import WEAK_GAP, faithfulness, gap, gap_note
from mechsink.inputs.prompts import make_prompts
from mechsink.patching import MassiveValue
from mechsink.patching.metrics import KLToClean


def _tokens(model):
    return make_prompts(model, "natural", "bos", n=2, seq_len=6).tokens


def test_weak_gap_is_flagged_in_the_result_and_its_summary(llama_tiny):
    tokens = _tokens(llama_tiny)
    found = discover(llama_tiny, tokens, MassiveValue(1, 0, 3), method="eap", verify=0,
                     ablation="position_mean", positions=[0])
    g = found.meta["faithfulness_gap"]
    # the same two values, read independently from a fresh run
    run = GraphRun(llama_tiny, tokens, MassiveValue(1, 0, 3), ablation="position_mean",
                   positions=[0])
    clean, empty = run.clean_value, run.empty_value
    assert g["clean"] == clean and g["empty"] == empty
    assert math.isclose(g["relative"], abs(clean - empty) / max(abs(clean), abs(empty)))
    assert g["relative"] < WEAK_GAP and g["status"] == "weak"
    assert "hardly moves this metric" in found.summary()
    assert found.to_dict()["faithfulness_gap"]["status"] == "weak"


def test_gap_within_float_noise_gives_no_faithfulness(llama_tiny):
    """A metric the corruption cannot move: every faithfulness is NaN (null in JSON)."""
    def constant(logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1, 0].mean() * 0.0 + 2.0

    run = GraphRun(llama_tiny, _tokens(llama_tiny), constant, ablation="zero", positions=[0])
    assert gap(run)["status"] == "noise"
    keeps = torch.ones(1, run.graph.n_edges, dtype=torch.bool)
    assert torch.isnan(faithfulness(run, keeps)).all()
    assert "undefined" in gap_note(gap(run))


def test_a_clear_gap_has_no_note(llama_tiny):
    run = GraphRun(llama_tiny, _tokens(llama_tiny), KLToClean(), ablation="zero")
    g = gap(run)
    assert g["status"] == "ok" and g["relative"] >= WEAK_GAP and gap_note(g) is None
