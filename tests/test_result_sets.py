"""A command's output folder holds one whole result set or the previous one (mechsink.io)."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mechsink.io import (
    MANIFEST,
    DiskFullError,
    IncompleteResultError,
    check_result_set,
    result_set,
)


def _write(folder: Path, files: dict[str, str]) -> None:
    with result_set(folder, command="test") as staging:
        for name, text in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text)


def test_a_result_set_is_swapped_in_with_its_manifest(tmp_path: Path) -> None:
    _write(tmp_path, {"a.json": "1", "fig/b.png": "22"})
    assert (tmp_path / "a.json").read_text() == "1"
    manifest = check_result_set(tmp_path, full=True)
    assert set(manifest["files"]) == {"a.json", "fig/b.png"}
    assert manifest["files"]["fig/b.png"]["bytes"] == 2
    assert not list(tmp_path.glob(".mechsink-staging-*"))


def test_a_new_set_replaces_the_old_one_whole(tmp_path: Path) -> None:
    _write(tmp_path, {"a.json": "old", "old-only.png": "x", "fig/b.png": "old"})
    _write(tmp_path, {"a.json": "new", "fig/c.png": "new"})
    assert (tmp_path / "a.json").read_text() == "new"
    assert not (tmp_path / "old-only.png").exists()
    assert not (tmp_path / "fig" / "b.png").exists()  # a folder is replaced whole
    assert set(check_result_set(tmp_path)["files"]) == {"a.json", "fig/c.png"}


def test_a_failed_run_leaves_the_previous_set_untouched(tmp_path: Path) -> None:
    _write(tmp_path, {"a.json": "seed 0", "b.png": "seed 0"})
    before = (tmp_path / MANIFEST).read_text()
    with pytest.raises(RuntimeError), result_set(tmp_path) as staging:
        (staging / "a.json").write_text("seed 1")
        raise RuntimeError("the figure failed")
    assert (tmp_path / "a.json").read_text() == "seed 0"
    assert (tmp_path / MANIFEST).read_text() == before
    assert not list(tmp_path.glob(".mechsink-staging-*"))


def test_a_full_disk_is_one_line_and_the_previous_set_stands(tmp_path: Path) -> None:
    _write(tmp_path, {"a.json": "seed 0"})
    with pytest.raises(DiskFullError) as info, result_set(tmp_path) as staging:
        (staging / "a.json").write_text("seed 1")
        raise OSError(errno.ENOSPC, "No space left on device")
    assert "\n" not in str(info.value) and "untouched" in str(info.value)
    assert (tmp_path / "a.json").read_text() == "seed 0"
    check_result_set(tmp_path, full=True)


def test_check_result_set_finds_a_missing_manifest_or_a_cut_file(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    with pytest.raises(IncompleteResultError, match="no manifest.json"):
        check_result_set(tmp_path)
    _write(tmp_path, {"a.json": "0123456789"})
    (tmp_path / "a.json").write_text("01234")
    with pytest.raises(IncompleteResultError, match="does not match"):
        check_result_set(tmp_path)


_KILLED = """
import sys, time
from pathlib import Path
from mechsink.io import result_set
with result_set(Path(sys.argv[1])) as staging:
    (staging / "a.json").write_text("seed 1")
    print("writing", flush=True)
    time.sleep(60)
"""


def test_a_kill_mid_write_leaves_the_previous_set_and_the_next_run_cleans_up(
        tmp_path: Path) -> None:
    _write(tmp_path, {"a.json": "seed 0"})
    proc = subprocess.Popen([sys.executable, "-c", _KILLED, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (tmp_path / "a.json").read_text() == "seed 0"
    check_result_set(tmp_path, full=True)
    assert len(list(tmp_path.glob(".mechsink-staging-*"))) == 1  # the dead writer's
    time.sleep(0.05)
    _write(tmp_path, {"a.json": "seed 2"})
    assert not list(tmp_path.glob(".mechsink-staging-*"))
    assert json.loads((tmp_path / MANIFEST).read_text())["command"] == "test"


# --- every writing command writes a result set; a full disk is one line (#29 items 4, 5, 8) ---


def _invoke(args: list[str]):
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    return CliRunner().invoke(app, args)


def _full_disk_line(result) -> str:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    # the error is the last thing said (a step slower than 5 s, e.g. loading on a busy
    # machine, says its time on a line before it)
    text = " ".join(result.output.split("error:", 1)[-1].split())
    assert "error:" in result.output and "disk is full" in text and "Traceback" not in text
    return "error: " + text


def _full_savefig(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


SCAN = ["scan", "random:gpt2-tiny", "--n", "2", "--seq-len", "8", "--suite", "natural",
        "--variant", "bos", "--batch-size", "2"]


def test_scan_is_one_result_set_and_a_full_disk_keeps_the_previous_one(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    out = tmp_path / "scan"
    first = _invoke([*SCAN, "--out", str(out), "--seed", "0"])
    assert first.exit_code == 0, first.output
    files = set(check_result_set(out, full=True)["files"])
    assert {"census.json", "index.html"} <= files and any(f.endswith(".png") for f in files)
    before = {f: (out / f).read_bytes() for f in files}
    monkeypatch.setattr(Figure, "savefig", _full_savefig)  # the disk fills at the first figure
    _full_disk_line(_invoke([*SCAN, "--out", str(out), "--seed", "1"]))
    assert {f: (out / f).read_bytes() for f in files} == before  # seed 0's set, whole
    assert json.loads((out / "census.json").read_text())["settings"]["seed"] == 0
    check_result_set(out, full=True)
    assert not list(out.glob(".mechsink-staging-*"))


PATCH = ["patch", "random:gpt2-tiny", "--clean", "When Mary and John went", "--corrupted",
         "When Mary and Anna went", "--metric", "log_prob:0", "--layers", "0", "--device", "cpu"]


def test_patch_writes_json_and_figure_as_one_set_and_a_full_disk_is_one_line(tmp_path,
                                                                            monkeypatch):
    from matplotlib.figure import Figure

    out = tmp_path / "patch"
    first = _invoke([*PATCH, "--out", str(out)])
    assert first.exit_code == 0, first.output
    assert set(check_result_set(out, full=True)["files"]) == {"patch.json", "patch.png"}
    assert (out / "patch.png").read_bytes().startswith(b"\x89PNG")
    before = (out / "patch.json").read_bytes()
    monkeypatch.setattr(Figure, "savefig", _full_savefig)
    _full_disk_line(_invoke([*PATCH, "--out", str(out), "--site", "attn_out"]))
    assert (out / "patch.json").read_bytes() == before
    check_result_set(out, full=True)


def test_an_experiment_result_is_saved_whole_or_not_at_all(tmp_path, monkeypatch):
    from mechsink.errors import BadInputError
    from mechsink.experiments import ExperimentResult

    out = tmp_path / "exp"

    def summary_fails(self):
        raise BadInputError("--top 999 is more than the model's heads")

    monkeypatch.setattr(ExperimentResult, "summary", summary_fails)
    with pytest.raises(BadInputError):
        ExperimentResult("sink_timeline", {"schema": "x"}).save(out)
    assert not (out / "result.json").exists()  # the old save wrote the JSON first

    monkeypatch.setattr(ExperimentResult, "summary", lambda self: f"seed {self.data['seed']}\n")
    monkeypatch.setattr(ExperimentResult, "figure",
                        lambda self, path: Path(path).write_bytes(b"png") and Path(path))
    ExperimentResult("sink_timeline", {"seed": 0}).save(out)
    check_result_set(out, full=True)

    def figure_fills_the_disk(self, path):
        Path(path).write_bytes(b"p")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ExperimentResult, "figure", figure_fills_the_disk)
    with pytest.raises(DiskFullError):
        ExperimentResult("sink_timeline", {"seed": 1}).save(out)
    assert (out / "summary.md").read_text() == "seed 0\n"
    check_result_set(out, full=True)


# --- strict JSON: non-finite numbers are null with a reason, never NaN or 0.0 -----------------


def _strict_load(text: str):
    def refuse(constant: str):
        raise AssertionError(f"{constant} literal in the JSON")

    return json.loads(text, parse_constant=refuse)


def test_atomic_write_json_is_strict_and_says_why_a_value_is_null(tmp_path: Path) -> None:
    import numpy as np
    import torch

    from mechsink.io import atomic_write_json

    data = {"ok": 0.5, "score": float("nan"), "row": [1.0, float("inf"), float("-inf")],
            "nested": {"norm": np.float32("nan")}, "t": torch.tensor([2.0, float("nan")])}
    back = _strict_load(atomic_write_json(tmp_path / "x.json", data).read_text())
    assert back["ok"] == 0.5 and back["score"] is None and back["row"] == [1.0, None, None]
    assert back["t"] == [2.0, None] and back["nested"]["norm"] is None
    assert back["score_reason"] == "not finite: 1 NaN (written as null)"
    assert back["row_reason"] == "not finite: 1 -inf, 1 inf (written as null)"
    assert "NaN" in back["nested"]["norm_reason"] and "nested_reason" not in back


def test_scan_writes_a_non_finite_census_value_as_null_with_its_reason(tmp_path, monkeypatch):
    from mechsink.measure import census as census_module

    real = census_module.census

    def with_a_nan(*args, **kwargs):
        result = real(*args, **kwargs)
        data = result.to_dict()
        data["runs"][0]["sink_rate"] = float("nan")  # as a NaN weight would give
        return SimpleNamespace(to_dict=lambda: data)

    monkeypatch.setattr(census_module, "census", with_a_nan)
    out = tmp_path / "scan"
    result = _invoke([*SCAN, "--out", str(out), "--no-report"])
    assert "Traceback" not in result.output
    back = _strict_load((out / "census.json").read_text())
    run = back["runs"][0]
    assert result.exit_code == 0, result.output
    assert run["sink_rate"] is None and "NaN" in run["sink_rate_reason"]
