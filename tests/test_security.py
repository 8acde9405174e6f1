"""Folders a user receives are data, never instructions: a planted manifest, a symbolic link
in an output folder or the cache, a hostile token string never make mechsink write, delete or
run anything outside what it was asked to."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mechsink.app.cli import app
from mechsink.errors import BadInputError, MechsinkWarning
from mechsink.io import (
    LOCK_FILE,
    MANIFEST,
    IncompleteResultError,
    check_result_set,
    folder_lock,
    result_set,
)

PATCH = ["patch", "random:gpt2-tiny", "--clean", "The cat sat on the mat", "--corrupted",
         "The dog sat on the mat", "--metric", "sink_score:1", "--device", "cpu"]


def _plant_manifest(out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    files = {name: {"bytes": 1, "sha256": "x"} for name in names}
    (out / MANIFEST).write_text(json.dumps({"format": "mechsink-manifest/1", "files": files}))


# --- 1. a planted manifest -----------------------------------------------------------------------


def test_planted_manifest_cannot_delete_outside_out(tmp_path: Path) -> None:
    """The command of the report: `mechsink patch ... --out o` with o/manifest.json naming
    ../victim.txt and an absolute path; both victims survive, the command succeeds and its
    own manifest replaces the planted one."""
    out = tmp_path / "o"
    victim, absolute = tmp_path / "victim.txt", tmp_path / "elsewhere" / "abs.txt"
    absolute.parent.mkdir()
    victim.write_text("hi\n")
    absolute.write_text("hi\n")
    _plant_manifest(out, ["../victim.txt", str(absolute)])
    with pytest.warns(MechsinkWarning, match="not a file inside"):
        result = CliRunner().invoke(app, [*PATCH, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "hi\n" and absolute.read_text() == "hi\n"
    assert (out / "patch.json").is_file()
    assert set(check_result_set(out, full=True)["files"]) >= {"patch.json"}


def test_manifest_entry_through_a_symlink_out_is_left_alone(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    out = tmp_path / "o"
    out.mkdir()
    (out / "link").symlink_to(outside, target_is_directory=True)
    (out / "own.txt").write_text("old")
    _plant_manifest(out, ["link/keep.txt", "own.txt"])
    with pytest.warns(MechsinkWarning, match="link/keep.txt"), result_set(out) as staging:
        (staging / "new.txt").write_text("new")
    assert (outside / "keep.txt").read_text() == "keep"
    assert not (out / "own.txt").exists()  # a name inside the folder is still cleaned up
    assert set(check_result_set(out)["files"]) == {"new.txt"}


def test_a_link_in_out_is_replaced_not_written_through(tmp_path: Path) -> None:
    """A top-level name of the new result that is a link in --out (to a file or a folder
    elsewhere) is replaced by the result; the link's target is untouched."""
    outside = tmp_path / "outside"
    (outside / "fig").mkdir(parents=True)
    (outside / "a.json").write_text("theirs")
    (outside / "fig" / "b.png").write_text("theirs")
    out = tmp_path / "o"
    out.mkdir()
    (out / "a.json").symlink_to(outside / "a.json")
    (out / "fig").symlink_to(outside / "fig", target_is_directory=True)
    with result_set(out) as staging:
        (staging / "a.json").write_text("mine")
        (staging / "fig").mkdir()
        (staging / "fig" / "b.png").write_text("mine")
    assert (outside / "a.json").read_text() == "theirs"
    assert (outside / "fig" / "b.png").read_text() == "theirs"
    assert not (out / "a.json").is_symlink() and (out / "a.json").read_text() == "mine"
    assert not (out / "fig").is_symlink() and (out / "fig" / "b.png").read_text() == "mine"


def test_check_result_set_refuses_a_manifest_naming_files_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "victim.txt").write_text("x")
    _plant_manifest(tmp_path / "o", ["../victim.txt"])
    with pytest.raises(IncompleteResultError, match="not a file inside"):
        check_result_set(tmp_path / "o")


# --- 3. symbolic links are never followed on write ------------------------------------------------


def test_lock_in_out_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path
                                                                           ) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "o"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(victim)
    result = CliRunner().invoke(app, [*PATCH, "--out", str(out)])
    assert result.exit_code != 0
    assert "symbolic link" in result.output and "Traceback" not in result.output
    assert victim.read_text() == "precious\n"
    with pytest.raises(BadInputError, match="symbolic link"), folder_lock(out):
        pass
    assert victim.read_text() == "precious\n"


def test_lock_that_is_a_hard_link_to_another_file_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "o").mkdir()
    os.link(victim, tmp_path / "o" / LOCK_FILE)
    with pytest.raises(BadInputError, match="hard link"), folder_lock(tmp_path / "o"):
        pass
    assert victim.read_text() == "precious\n"


def test_a_lock_left_by_a_dead_process_is_still_taken_over(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 2**22 + 12345}) + "\n")
    with folder_lock(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()


def test_conversion_lock_that_is_a_symlink_is_refused(tmp_path: Path, monkeypatch) -> None:
    from mechsink.model.zoo.stale import conversion_lock, lock_path

    monkeypatch.setenv("MECHSINK_CACHE", str(tmp_path / "cache"))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock = lock_path("smollm2-135m")
    lock.parent.mkdir(parents=True)
    lock.symlink_to(victim)
    with pytest.raises(BadInputError, match="symbolic link"), conversion_lock("smollm2-135m"):
        pass
    assert victim.read_text() == "precious\n"


SWEEP = """\
models = ["random:gpt2-tiny"]
jobs = ["census"]

[census]
suites = ["random"]
variants = ["bos"]
n = 1
seq_len = 8
"""


@pytest.mark.parametrize("sub", ["shards", "census"])
def test_sweep_whose_shard_or_job_folder_is_a_symlink_is_refused(tmp_path: Path, sub: str
                                                                  ) -> None:
    from mechsink.app.sweep import run_sweep

    (tmp_path / "spec.toml").write_text(SWEEP)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / sub).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(BadInputError, match="symbolic link") as info:
        run_sweep(tmp_path / "spec.toml", out)
    assert "\n" not in str(info.value)
    assert list(elsewhere.iterdir()) == []
    assert not (out / "summary.json").exists()
