"""The command line's options for positions, key positions, dtype and BOS on patch and
discover, against the library called directly with the same choices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mechsink import load_model
from mechsink.app.cli import app
from mechsink.model import to_tokens
from mechsink.patching import SinkScore, activation_patch, parse_site
from mechsink.patching.result import PatchResult

CLEAN, CORRUPTED = "The cat sat on the mat", "The dog sat on the mat"


def test_patch_positions_and_key_position_equal_the_library(tmp_path: Path):
    out = tmp_path / "p"
    result = CliRunner().invoke(app, [
        "patch", "random:gpt2-tiny", "--clean", CLEAN, "--corrupted", CORRUPTED,
        "--metric", "sink_score:1", "--positions", "0,2", "--key-position", "1",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = PatchResult.from_json(out / "patch.json")
    model = load_model("random:gpt2-tiny", device="cpu", seed=0)
    c, x = (to_tokens(model, t, prepend_bos=True) for t in (CLEAN, CORRUPTED))
    mine = activation_patch(model, c, x, parse_site("resid_pre", positions=(0, 2)),
                            SinkScore(1, position=1))
    assert torch.allclose(saved.values, mine.values, atol=1e-6)
    assert saved.values.shape == mine.values.shape


def test_patch_dtype_loads_the_model_in_that_dtype(tmp_path: Path, monkeypatch):
    import mechsink.model.zoo as zoo

    seen = {}
    real = zoo.load_model

    def spy(name, **kw):
        seen.update(kw)
        return real(name, **kw)

    monkeypatch.setattr(zoo, "load_model", spy)
    result = CliRunner().invoke(app, [
        "patch", "random:gpt2-tiny", "--clean", CLEAN, "--corrupted", CORRUPTED,
        "--metric", "sink_score:1", "--layers", "0", "--dtype", "bfloat16",
        "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    assert seen["dtype"] == "bfloat16"


@pytest.mark.parametrize("args, message", [
    (["--clean", "", "--corrupted", ""], "--clean prompt 1 is empty"),
    (["--clean", CLEAN, "--corrupted", CORRUPTED, "--key-position", "1"],
     "--key-position is the key position of a sink_score metric"),
    (["--clean", CLEAN, "--corrupted", CORRUPTED, "--metric", "sink_score:1",
      "--key-position", "-1"], "position numbers start at 0"),
    (["--clean", CLEAN, "--corrupted", CORRUPTED, "--dtype", "int8"], "unknown dtype"),
    (["--clean", CLEAN, "--corrupted", CORRUPTED, "--positions", "a"], "position numbers"),
])
def test_patch_options_are_checked_before_loading(tmp_path: Path, args, message):
    result = CliRunner().invoke(app, ["patch", "random:gpt2-tiny", *args,
                                      "--out", str(tmp_path / "p")])
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_discover_without_bos_tokenises_the_prompts_without_it(tmp_path: Path):
    out = tmp_path / "d"
    result = CliRunner().invoke(app, [
        "discover", "random:llama-tiny", "--metric", "massive_value:1:0:3", "--method", "eap",
        "--clean", CLEAN, "--no-prepend-bos", "--dtype", "float32", "--verify", "0",
        "--out", str(out)])
    assert result.exit_code == 0, result.output
    model = load_model("random:llama-tiny", device="cpu", seed=0)
    settings = json.loads((out / "discover.json").read_text())["scores"]["settings"]
    assert settings["seq_len"] == to_tokens(model, CLEAN, prepend_bos=False).shape[-1]
    assert settings["seq_len"] + 1 == to_tokens(model, CLEAN, prepend_bos=True).shape[-1]


@pytest.mark.parametrize("ref, message", [("/no/such/folder", "the folder does not exist"),
                                          ("./missing", "the folder does not exist")])
def test_a_missing_hf_folder_is_named_as_a_folder(tmp_path: Path, ref, message):
    result = CliRunner().invoke(app, ["info", f"hf:{ref}"])
    assert result.exit_code != 0 and message in result.output, result.output
    assert "Repo id" not in result.output
    (tmp_path / "file").write_text("x")
    result = CliRunner().invoke(app, ["info", f"hf:{tmp_path / 'file'}"])
    assert "is a file, not a folder" in result.output, result.output


def test_scan_writes_a_line_per_step_into_a_log(tmp_path: Path, monkeypatch):
    """Off a terminal (a log), every step of scan that runs long says when it ends: the load,
    each census run, the set validation and the report (here every step counts as long)."""
    import mechsink.app.cli as cli
    import mechsink.progress as progress

    monkeypatch.setattr(cli, "STEP_LINE_AFTER", 0.0)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.setattr(progress, "mode", lambda: "log")
    result = CliRunner().invoke(app, [
        "scan", "random:llama-tiny", "--n", "2", "--seq-len", "8", "--suite", "natural",
        "--validate-sets", "--out", str(tmp_path / "s")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for start in ("loading random:llama-tiny: ", "census natural/bos: 2/2 in ",
                  "census natural/randfirst: 2/2 in ", "census: validating super-neuron sets: ",
                  "writing figures and pages: "):
        assert any(line.startswith(start) for line in lines), (start, result.output)
