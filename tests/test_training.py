"""Organism training: deterministic, resumable after a kill, clear errors, loadable checkpoints."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mechsink import load_model, training
from mechsink.errors import BadInputError
from mechsink.tasks import BigramBackcopy
from mechsink.training import Recipe, checkpoint_steps, train

TINY = Recipe("test-tiny", "llama", n_layers=1, d_model=32, n_heads=2, data="bigram-backcopy",
              seq_len=16, batch_size=4, steps=6, lr=1e-2, warmup=2)
TINY_GPT2 = Recipe("test-tiny-gpt2", "gpt2", n_layers=1, d_model=32, n_heads=2,
                   data="bigram-backcopy", seq_len=16, batch_size=4, steps=6, lr=1e-2, warmup=2)


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


@pytest.mark.parametrize("recipe", [TINY, TINY_GPT2], ids=["llama", "gpt2"])
def test_same_seed_same_run(tmp_path, recipe):
    a = train(recipe, tmp_path / "a", seed=1, progress=False)
    b = train(recipe, tmp_path / "b", seed=1, progress=False)
    run_a, run_b = (json.loads((p / "run.json").read_text()) for p in (a, b))
    assert run_a["losses"] == run_b["losses"] and len(run_a["losses"]) == 6
    assert run_a["checkpoints"] == checkpoint_steps(6) == [0, 1, 2, 4, 6]
    for key, value in _weights(a / "step-6").items():
        assert torch.equal(value, _weights(b / "step-6")[key]), key


@pytest.mark.parametrize("recipe", [TINY, TINY_GPT2], ids=["llama", "gpt2"])
def test_training_lowers_the_loss(tmp_path, recipe):
    longer = dataclasses.replace(recipe, batch_size=16, warmup=5)
    out = train(longer, tmp_path / "run", seed=0, steps=60, progress=False)
    losses = json.loads((out / "run.json").read_text())["losses"]
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.25


def test_killed_and_resumed_run_equals_uninterrupted(tmp_path, monkeypatch):
    whole = train(TINY, tmp_path / "whole", seed=2, progress=False)
    real_step = training.train_step
    calls = {"n": 0}

    def dies_at_step_5(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 6:  # steps 0..4 ran, checkpoint 4 written; killed during step 5
            raise KeyboardInterrupt
        return real_step(*args, **kwargs)

    monkeypatch.setattr(training, "train_step", dies_at_step_5)
    with pytest.raises(KeyboardInterrupt):
        train(TINY, tmp_path / "resumed", seed=2, progress=False)
    monkeypatch.setattr(training, "train_step", real_step)
    assert json.loads((tmp_path / "resumed" / "run.json").read_text())["checkpoints"][-1] == 4
    resumed = train(TINY, tmp_path / "resumed", seed=2, resume=True, progress=False)
    run_w, run_r = (json.loads((p / "run.json").read_text()) for p in (whole, resumed))
    assert run_r["losses"] == run_w["losses"]
    for key, value in _weights(whole / "step-6").items():
        assert torch.equal(value, _weights(resumed / "step-6")[key]), key


def test_checkpoints_load_as_organisms(tmp_path):
    out = train(TINY, tmp_path / "run", seed=0, progress=False)
    model = load_model(f"organism:{out / 'step-6'}", device="cpu")
    tokens = BigramBackcopy().batch(0, 123, 2, 16)
    logits = model(tokens)
    assert logits.shape == (2, 16, BigramBackcopy().vocab_size)
    assert model.tokenizer.bos_token_id == BigramBackcopy().bos


def test_bigram_backcopy_copies_after_triggers():
    task = BigramBackcopy()
    tokens = task.batch(seed=0, step=0, batch_size=64, seq_len=32).numpy()
    assert (tokens[:, 0] == task.bos).all()
    body = tokens[:, 1:]
    assert (body < task.vocab).all()
    rows, cols = np.nonzero(np.isin(body[:, 1:-1], task.triggers))
    cols = cols + 1  # index into body of each trigger that has a predecessor and a successor
    assert len(rows) > 20
    assert (body[rows, cols + 1] == body[rows, cols - 1]).all()


def test_bad_recipe_steps_and_folders_are_clear_errors(tmp_path):
    with pytest.raises(BadInputError, match="unknown recipe"):
        train("no-such-recipe", tmp_path / "x")
    with pytest.raises(BadInputError, match="positive"):
        train(TINY, tmp_path / "x", steps=0)
    train(TINY, tmp_path / "run", seed=0, steps=2, progress=False)
    with pytest.raises(BadInputError, match="different run"):
        train(TINY, tmp_path / "run", seed=1, steps=2, progress=False)
    with pytest.raises(BadInputError, match="resume"):
        train(TINY, tmp_path / "run", seed=0, steps=2, progress=False)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(BadInputError, match="not empty"):
        train(TINY, tmp_path / "other", progress=False)


def test_train_command(tmp_path):
    from typer.testing import CliRunner

    from mechsink.cli import app

    runner = CliRunner()
    ok = runner.invoke(app, ["train", "bb-gpt2-tiny", "--out", str(tmp_path / "run"),
                             "--steps", "2"])
    assert ok.exit_code == 0, ok.output
    assert json.loads((tmp_path / "run" / "run.json").read_text())["checkpoints"] == [0, 1, 2]
    bad = runner.invoke(app, ["train", "bb-nothing", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown recipe" in bad.output
