"""When the exact re-check of the top edges disagrees with the method, the circuit is selected
again from exact scores until it rests on them (or max_exact says it could not)."""

from __future__ import annotations

import warnings

import torch

from mechsink.discover import GraphRun, discover, scores
from mechsink.discover.scores import UntrustedScoresWarning
from mechsink.inputs.prompts import make_prompts
from mechsink.patching import MassiveValue


def _found(model, monkeypatch, **kw):
    monkeypatch.setattr(scores, "AGREEMENT_BOUND", 2.0)  # every re-check "disagrees"
    tokens = make_prompts(model, "natural", "bos", n=2, seq_len=6).tokens
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UntrustedScoresWarning)
        found = discover(model, tokens, MassiveValue(1, 0, 3), method="eap", verify=5,
                         ablation="position_mean", positions=[0], n_edges=12, **kw)
    return tokens, found


def test_the_circuit_rests_on_exact_scores(llama_tiny, monkeypatch):
    tokens, found = _found(llama_tiny, monkeypatch)
    info = found.scores.settings["exact_selection"]
    assert info["rests_on_exact"] and info["estimated_in_circuit"] == 0
    run = GraphRun(llama_tiny, tokens, MassiveValue(1, 0, 3), ablation="position_mean",
                   positions=[0])
    exact = run.exact(found.circuit.edges) - run.clean_value  # independently, every edge
    assert torch.allclose(found.scores.values[found.circuit.edges], exact, atol=1e-6)
    assert "every edge of the circuit rests on its exact score" in found.summary()


def test_a_cap_too_small_is_said_plainly(llama_tiny, monkeypatch):
    _, found = _found(llama_tiny, monkeypatch, max_exact=6)
    info = found.scores.settings["exact_selection"]
    assert not info["rests_on_exact"] and info["estimated_in_circuit"] > 0
    assert "still carry estimates" in found.summary()
