"""Organism training: deterministic, resumable after a kill, clear errors, loadable checkpoints."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mechsink import load_model
from mechsink.errors import BadInputError
from mechsink.inputs.tasks import BigramBackcopy
from mechsink.training import loop as training
from mechsink.training.loop import Recipe, checkpoint_steps, train

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

    from mechsink.app.cli import app

    runner = CliRunner()
    ok = runner.invoke(app, ["train", "bb-gpt2-tiny", "--out", str(tmp_path / "run"),
                             "--steps", "2"])
    assert ok.exit_code == 0, ok.output
    assert json.loads((tmp_path / "run" / "run.json").read_text())["checkpoints"] == [0, 1, 2]
    bad = runner.invoke(app, ["train", "bb-nothing", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "unknown recipe" in bad.output


# --- reliability: resume, leftovers, locks, weight decay -------------------------------------


def test_resume_with_nothing_to_resume_says_so(tmp_path):
    for folder in (tmp_path / "missing", tmp_path / "empty"):
        if folder.name == "empty":
            folder.mkdir()
        with pytest.raises(BadInputError, match="nothing to resume"):
            train(TINY, folder, resume=True, progress=False)
    assert not (tmp_path / "missing").exists()  # not created by a failed resume
    assert list((tmp_path / "empty").iterdir()) == []


def test_resume_without_steps_says_the_steps_are_needed(tmp_path):
    train(TINY, tmp_path / "run", seed=0, steps=2, progress=False)
    with pytest.raises(BadInputError, match="pass --steps 2") as err:
        train(TINY, tmp_path / "run", seed=0, resume=True, progress=False)
    assert "new folder" not in str(err.value)


def test_resume_removes_temporary_files_of_a_killed_checkpoint_write(tmp_path):
    out = train(TINY, tmp_path / "run", seed=0, steps=2, progress=False)
    run = json.loads((out / "run.json").read_text())
    run["checkpoints"], run["losses"] = [0, 1], run["losses"][:1]  # as if killed writing step 2
    (out / "run.json").write_text(json.dumps(run))
    leftovers = [out / ".run.json.abc123.part", out / ".step-2.optimizer.pt.x1.part"]
    for f in leftovers:
        f.write_bytes(b"half")
    (out / ".step-2.k9.part").mkdir()
    (out / ".step-2.k9.part" / "model.safetensors").write_bytes(b"half")
    train(TINY, out, seed=0, steps=2, resume=True, progress=False)
    names = sorted(p.name for p in out.iterdir())
    assert [n for n in names if n.startswith(".")] == []
    assert json.loads((out / "run.json").read_text())["checkpoints"] == [0, 1, 2]


def test_a_second_trainer_on_the_same_folder_fails_naming_the_first(tmp_path):
    import subprocess
    import sys
    import textwrap

    from mechsink.io import folder_lock

    holder = textwrap.dedent("""
        import sys, time
        from mechsink.io import folder_lock
        with folder_lock(sys.argv[1], command="mechsink train bb-llama-tiny --seed 0"):
            print("locked", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", holder, str(tmp_path / "run")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        with pytest.raises(BadInputError, match=f"process {proc.pid} .*--seed 0"):
            train(TINY, tmp_path / "run", seed=1, steps=2, progress=False)
    finally:
        proc.kill()
        proc.wait()
    assert not (tmp_path / "run" / "run.json").exists()
    with folder_lock(tmp_path / "run"):  # the dead holder's lock is taken over
        pass


@pytest.mark.parametrize("recipe", [TINY, TINY_GPT2], ids=["llama", "gpt2"])
def test_weight_decay_only_on_matmul_weights(recipe):
    model = training.seeded_model(recipe.config(), 0)
    groups = training.param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = sorted(names[id(p)] for p in groups[0]["params"])
    kept = sorted(names[id(p)] for p in groups[1]["params"])
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    if recipe.family == "gpt2":  # hand list: GPT-2's Conv1D matrices; wte is tied to lm_head
        assert decayed == [f"transformer.h.0.{m}.weight" for m in
                           ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
        assert {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
                "transformer.ln_f.bias", "transformer.h.0.attn.c_attn.bias"} <= set(kept)
    else:
        assert decayed == sorted(["lm_head.weight"] + [
            f"model.layers.0.{m}.weight" for m in
            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")])
        assert kept == ["model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                        "model.layers.0.post_attention_layernorm.weight", "model.norm.weight"]
    assert len(decayed) + len(kept) == len(list(model.parameters()))


def test_weight_decay_leaves_biases_norms_and_embeddings_alone(tmp_path):
    """With a gradient of zero (lr applied, loss constant), AdamW moves only decayed weights."""
    model = training.seeded_model(TINY_GPT2.config(), 0)
    opt = torch.optim.AdamW(training.param_groups(model, 0.5), lr=0.1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    for n, p in model.named_parameters():
        moved = not torch.equal(p, before[n])
        assert moved == (n.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))), n


def test_task_of_reads_the_organisms_recipe():
    from mechsink.model.zoo import organism_recipe

    assert organism_recipe("organism:bb-gpt2-tiny") == "bb-gpt2-tiny"
    assert training.task_of("organism:bb-gpt2-tiny") == BigramBackcopy()
    assert training.task_of("random:gpt2-tiny") is None
    assert not hasattr(Recipe("x", "gpt2", 1, 8, 1, "text"), "extra")


# --- a train killed during its first checkpoint can be resumed or restarted (#29 item 14) ----


def _killed_in_first_checkpoint(out, monkeypatch):
    """Run TINY into ``out`` and kill it while step 0's optimizer state is written."""
    real = training.atomic_write_bytes

    def killed(target, data):
        if str(target).endswith("step-0.optimizer.pt"):
            raise KeyboardInterrupt
        return real(target, data)

    monkeypatch.setattr(training, "atomic_write_bytes", killed)
    with pytest.raises(KeyboardInterrupt):
        train(TINY, out, seed=3, progress=False)
    monkeypatch.setattr(training, "atomic_write_bytes", real)
    assert (out / "step-0").is_dir() and not (out / "step-0.optimizer.pt").exists()


@pytest.mark.parametrize("resume", [True, False], ids=["resume", "restart"])
def test_a_run_killed_in_its_first_checkpoint_resumes_or_restarts(tmp_path, monkeypatch,
                                                                  resume):
    whole = train(TINY, tmp_path / "whole", seed=3, progress=False)
    out = tmp_path / "killed"
    _killed_in_first_checkpoint(out, monkeypatch)
    train(TINY, out, seed=3, resume=resume, progress=False)
    run_w, run_k = (json.loads((p / "run.json").read_text()) for p in (whole, out))
    assert run_k["losses"] == run_w["losses"] and run_k["checkpoints"] == run_w["checkpoints"]
    for key, value in _weights(whole / "step-6").items():
        assert torch.equal(value, _weights(out / "step-6")[key]), key


@pytest.mark.parametrize("resume", [True, False], ids=["resume", "restart"])
def test_a_first_checkpoint_without_run_json_is_started_afresh(tmp_path, resume):
    """What a run killed during its first checkpoint left before run.json came first."""
    whole = train(TINY, tmp_path / "whole", seed=3, progress=False)
    out = tmp_path / "old-kill"
    out.mkdir()
    shutil.copytree(whole / "step-0", out / "step-0")
    shutil.copy(whole / "step-0.optimizer.pt", out / "step-0.optimizer.pt")
    (out / ".step-1.x1.part").mkdir()
    train(TINY, out, seed=3, resume=resume, progress=False)
    assert json.loads((out / "run.json").read_text())["losses"] == json.loads(
        (whole / "run.json").read_text())["losses"]


def test_a_full_disk_during_training_is_one_line_and_the_checkpoints_stand(tmp_path,
                                                                          monkeypatch):
    import errno

    from mechsink.io import DiskFullError

    out = tmp_path / "run"
    real = training.atomic_write_bytes

    def full(target, data):
        if str(target).endswith("step-2.optimizer.pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(target, data)

    monkeypatch.setattr(training, "atomic_write_bytes", full)
    with pytest.raises(DiskFullError) as info:
        train(TINY, out, seed=0, progress=False)
    assert "\n" not in str(info.value) and "--resume" in str(info.value)
    assert json.loads((out / "run.json").read_text())["checkpoints"] == [0, 1]
    monkeypatch.setattr(training, "atomic_write_bytes", real)
    train(TINY, out, seed=0, resume=True, progress=False)
    assert json.loads((out / "run.json").read_text())["checkpoints"] == [0, 1, 2, 4, 6]
