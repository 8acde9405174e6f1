"""Edge discovery never writes NaN: non-finite edge scores are refused with one line, edges
left unscored and undefined faithfulness values are ``null`` with a reason (#29 item 1's
discovery part), and the JSON is strict."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from mechsink import load_model
from mechsink.discover import GraphRun, discover, exact_scores
from mechsink.errors import BadInputError
from mechsink.model import hf_model_of
from mechsink.patching import SinkScore


def _tokens(seed: int) -> torch.Tensor:
    t = torch.randint(5, 500, (2, 6), generator=torch.Generator().manual_seed(seed))
    t[:, 0] = 1
    return t


def test_non_finite_edge_scores_are_refused_not_written(tmp_path: Path) -> None:
    """Layer 1's attention weights NaN: TransformerLens turns the NaN pattern into zeros, so
    the sink score stays finite while every edge score was NaN (written as NaN literals)."""
    model = load_model("random:gpt2-tiny", device="cpu", seed=0)
    with torch.no_grad():
        hf_model_of(model).transformer.h[1].attn.c_attn.weight.fill_(math.nan)
    with pytest.raises(BadInputError, match=r"edge scores are not finite \(first: embed->"):
        discover(model, _tokens(0), SinkScore(1), ablation="zero", method="eap", verify=2,
                 n_random=0)


def test_unscored_edges_are_null_with_a_reason_and_the_json_is_strict(llama_tiny,
                                                                       tmp_path: Path) -> None:
    run = GraphRun(llama_tiny, _tokens(0), SinkScore(1), corrupted=_tokens(1))
    scored = [0, 5, 9]
    s = exact_scores(run, edges=scored)
    assert set(s.order()[:3].tolist()) == set(scored)  # NaN (unscored) edges come last
    rows = s.to_dict()["edges"]
    assert [r["score"] is None for r in rows] == [False] * 3 + [True] * (len(rows) - 3)
    assert all("not scored" in r["reason"] for r in rows[3:])
    json.dumps(s.to_dict(), allow_nan=False)


def test_undefined_faithfulness_is_null_with_a_reason(llama_tiny, tmp_path: Path) -> None:
    """Clean = corrupted input: m(clean) = m(empty), faithfulness 0/0 (NaN before, written as
    NaN literals into discover.json and circuit.json)."""
    t = _tokens(0)
    found = discover(llama_tiny, t, SinkScore(1), corrupted=t.clone(), method="eap",
                     verify=2, n_random=1, n_edges=3)
    found.save(tmp_path)
    data = json.loads((tmp_path / "discover.json").read_text(),
                      parse_constant=lambda c: pytest.fail(f"{c} in discover.json"))
    assert data["circuit"]["faithfulness"] is None
    assert "undefined" in data["non_finite"]["reason"]
    assert "curves[0].values[0]" in data["non_finite"]["paths"]
    json.loads((tmp_path / "circuit.json").read_text(),
               parse_constant=lambda c: pytest.fail(f"{c} in circuit.json"))
    assert "n/a" in (tmp_path / "summary.md").read_text()
    from mechsink.viz.discover import draw_discovery

    assert all(p.stat().st_size > 5_000 for p in draw_discovery(tmp_path)  # nulls drawn
               if p.suffix == ".png")
