"""The `mechsink patch` command writes the result JSON and the heatmap, and reports bad input."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mechsink.app.cli import app


def test_patch_command_writes_json_and_figure(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "patch", "random:gpt2-tiny", "--clean", "When Mary and John went",
        "--corrupted", "When Tom and John went", "--site", "z", "--metric", "sink_score:1",
        "--out", str(out), "--device", "cpu",
    ])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "patch.json").read_text())
    assert data["schema"] == "mechsink-patch/1" and data["axes"] == ["layer", "pos", "head"]
    assert (out / "patch.png").stat().st_size > 0


def test_patch_command_bad_site(tmp_path):
    result = CliRunner().invoke(app, [
        "patch", "random:gpt2-tiny", "--clean", "When Mary and John went",
        "--corrupted", "When Tom and John went", "--site", "nonsense", "--metric", "kl",
        "--out", str(tmp_path), "--device", "cpu",
    ])
    assert result.exit_code == 2 and "unknown site" in result.output
