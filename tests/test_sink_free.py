"""The sink-free comparison: twin organisms per variant, measured, tabled and re-rendered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.experiments import ExperimentResult, get_experiment, sink_free
from mechsink.model.zoo import load_organism_hf
from mechsink.training.loop import get_recipe


def test_twins_are_measured_and_the_sigmoid_sink_score_is_output_share(tmp_path: Path) -> None:
    result = sink_free.run(work_dir=tmp_path, recipes=["bb-llama-tiny"], variants=["sigmoid"],
                           seeds=[0], steps=[1])
    task = result.data["tasks"]["bb-llama-tiny"]
    assert set(task["arms"]) == {"softmax", "sigmoid"}
    plain, sig = task["arms"]["softmax"][0], task["arms"]["sigmoid"][0]
    assert plain["losses"][0] == pytest.approx(sig["losses"][0], abs=0.2)  # same task, init
    assert [p["step"] for p in sig["timeline"]] == [0, 1]
    # independent check of the largest sink score, from transformers' own attention output:
    # for sigmoid attention, A[i, 0] / sum_j A[i, j] averaged over queries i > 0 and sequences
    hf, _ = load_organism_hf(tmp_path / "runs" / "bb-llama-tiny+sigmoid-seed0" / "step-1")
    recipe = get_recipe("bb-llama-tiny")
    tokens = recipe.task().batch(sink_free.HELD_OUT_SEED, 0, 32, recipe.seq_len)
    with torch.no_grad():
        attentions = hf(tokens, output_attentions=True).attentions
    best = max((a[..., 1:, 0] / a[..., 1:, :].sum(-1)).mean(-1).mean(0).max().item()
               for a in attentions)
    assert sig["final"]["max_sink_score"] == pytest.approx(best, rel=1e-4)
    assert task["table"]["sigmoid"]["final_loss"]["mean"] == sig["final"]["final_loss"]
    out = result.save(tmp_path / "out")
    again = ExperimentResult.load(out, "sink_free")
    assert again.summary() == (out / "summary.md").read_text()
    assert "| sigmoid |" in again.summary() and (out / sink_free.FIGURE).stat().st_size > 5_000
    # a second run reuses the trained and measured organisms
    stamp = json.loads((tmp_path / "runs" / "bb-llama-tiny-seed0" / "measured.json").read_text())
    assert sink_free.run(work_dir=tmp_path, recipes=["bb-llama-tiny"], variants=["sigmoid"],
                         seeds=[0], steps=[1]).data["tasks"]["bb-llama-tiny"]["arms"][
        "softmax"][0] == stamp["arm"]


def test_bad_settings_fail_before_training(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="unknown variant"):
        sink_free.run(work_dir=tmp_path, variants=["nope"])
    with pytest.raises(BadInputError, match="one per recipe"):
        sink_free.run(work_dir=tmp_path, steps=[1, 2, 3])
    with pytest.raises(BadInputError, match="unknown recipe"):
        sink_free.run(work_dir=tmp_path, recipes=["nope"], steps=[1])
    assert not (tmp_path / "runs").exists()
    settings = get_experiment("sink_free").parse_settings(
        ["--recipes", "bb-llama-tiny", "--steps", "5", "--variants", "softpick"])
    assert settings == {"recipes": ["bb-llama-tiny"], "steps": [5], "variants": ["softpick"]}
