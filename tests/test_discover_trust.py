"""A method says when it cannot be trusted (#26 item 4): the exact re-check of its top edges
disagreeing beyond the bound warns, and those edges are then ranked by their exact scores, so
the circuit is selected from them; eap_ig's Python default QK fix equals the CLI's."""

from __future__ import annotations

import inspect

import pytest
import torch

from mechsink.discover import GraphRun, eap, eap_ig
from mechsink.discover import scores as sc
from mechsink.patching import SinkScore


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(5, 500, (2, 7), generator=torch.Generator().manual_seed(seed))


def test_a_disagreeing_recheck_warns_and_selects_from_exact_scores(llama_tiny, monkeypatch):
    run = GraphRun(llama_tiny, _tokens(0), SinkScore(1), corrupted=_tokens(1))
    plain = eap(run, qk_fix=False, verify=0)
    monkeypatch.setattr(sc, "AGREEMENT_BOUND", 1.01)  # every re-check now "disagrees"
    with pytest.warns(sc.UntrustedScoresWarning, match=r"top 6 edges agree poorly"):
        checked = eap(run, qk_fix=False, verify=6)
    top = plain.order()[:6].tolist()
    assert [c["edge"] for c in checked.checks] == [run.graph.edge_names[e] for e in top]
    exact = torch.tensor([c["exact"] for c in checked.checks], dtype=torch.float64)
    assert torch.equal(checked.values[top], exact)  # exact where it exists
    assert [c["score"] for c in checked.checks] == plain.values[top].tolist()  # estimates kept
    rest = torch.ones(run.graph.n_edges, dtype=torch.bool)
    rest[top] = False
    assert torch.equal(checked.values[rest], plain.values[rest])
    assert checked.settings["exact_where_checked"] is True


def test_the_warning_suggests_only_what_was_not_tried(llama_tiny, monkeypatch):
    """EAP-IG on activations is not told to use IG on activations (it was, in p0_edges)."""
    run = GraphRun(llama_tiny, _tokens(0), SinkScore(1), corrupted=_tokens(1))
    monkeypatch.setattr(sc, "AGREEMENT_BOUND", 1.01)
    with pytest.warns(sc.UntrustedScoresWarning) as got:
        eap_ig(run, steps=1, qk_fix=False, verify=6)
    text = str(got[0].message)
    assert "more steps" in text and "ig='activations'" not in text
    with pytest.warns(sc.UntrustedScoresWarning) as got:
        eap(run, qk_fix=False, verify=6)
    assert "ig='activations'" in str(got[0].message)


def test_too_few_checks_are_not_judged(llama_tiny, monkeypatch):
    run = GraphRun(llama_tiny, _tokens(0), SinkScore(1), corrupted=_tokens(1))
    monkeypatch.setattr(sc, "AGREEMENT_BOUND", 1.01)
    out = eap(run, qk_fix=False, verify=sc.MIN_CHECKS - 1)  # no warning (they are errors)
    assert "exact_where_checked" not in out.settings


def test_one_default_for_the_qk_fix():
    """#30 item 2: eap_ig's Python default equals the CLI's and discover()'s (True)."""
    from mechsink.app.cli import discover as cli_discover
    from mechsink.discover import discover

    defaults = [inspect.signature(f).parameters["qk_fix"].default for f in (eap_ig, eap,
                                                                              discover)]
    cli = inspect.signature(cli_discover).parameters["qk_fix"].default
    assert defaults == [True, True, True] and getattr(cli, "default", cli) is True


def test_one_default_for_the_ig_path():
    """EAP-IG on activations is the default everywhere (eap_ig, discover, the CLI): on the
    saturated sink metrics it agrees best with exact patching (benchmarks/discover_agreement)."""
    from mechsink.app.cli import discover as cli_discover
    from mechsink.discover import discover

    defaults = [inspect.signature(f).parameters["ig"].default for f in (eap_ig, discover)]
    cli = inspect.signature(cli_discover).parameters["ig"].default
    assert defaults == ["activations", "activations"]
    assert getattr(cli, "default", cli) == "activations"
