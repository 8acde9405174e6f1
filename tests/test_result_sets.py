"""A command's output folder holds one whole result set or the previous one (mechsink.io)."""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

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
