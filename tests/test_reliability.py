"""Reliability: writable-folder probes, one writer per folder (issue: reliability)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mechsink.errors import BadInputError
from mechsink.io import LOCK_FILE, FolderLockedError, check_writable, folder_lock

# --- writable-folder probe -------------------------------------------------------------------


def test_check_writable_creates_and_leaves_no_probe(tmp_path: Path) -> None:
    out = check_writable(tmp_path / "a" / "b")
    assert out.is_dir() and list(out.iterdir()) == []


@pytest.mark.parametrize("bad", ["", "  "])
def test_check_writable_empty_is_an_error(bad: str) -> None:
    with pytest.raises(BadInputError, match="--out is empty"):
        check_writable(bad)


def test_check_writable_file_and_unwritable(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(BadInputError, match="is a file"):
        check_writable(f)
    with pytest.raises(BadInputError, match="cannot be written"):
        check_writable("/proc/mechsink-x")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            with pytest.raises(BadInputError, match="cannot be written"):
                check_writable(ro)
        finally:
            ro.chmod(0o700)


# --- folder lock ---------------------------------------------------------------------------

_HOLDER = textwrap.dedent("""
    import sys, time
    from mechsink.io import folder_lock
    with folder_lock(sys.argv[1], command="holder-cmd --seed 0"):
        print("locked", flush=True)
        time.sleep(60)
""")


def _start_holder(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, str(folder)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    return proc


def test_second_writer_fails_naming_the_first(tmp_path: Path) -> None:
    proc = _start_holder(tmp_path)
    try:
        held = json.loads((tmp_path / LOCK_FILE).read_text())
        assert held["pid"] == proc.pid and held["command"] == "holder-cmd --seed 0"
        with pytest.raises(FolderLockedError) as err:
            with folder_lock(tmp_path):
                pass
        assert str(proc.pid) in str(err.value) and "holder-cmd --seed 0" in str(err.value)
    finally:
        proc.kill()
        proc.wait()
    # killed (-9): the lock file stays, names a dead pid, and is taken over
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == proc.pid
    with folder_lock(tmp_path, command="second"):
        assert json.loads((tmp_path / LOCK_FILE).read_text()) == {"pid": os.getpid(),
                                                                  "command": "second"}
    assert not (tmp_path / LOCK_FILE).exists()


def test_stale_lock_file_of_dead_pid_is_taken_over(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": int(dead.stdout), "command": "old"}))
    with folder_lock(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_lock_is_reentrant_in_one_process_and_released_after_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError):
        with folder_lock(tmp_path):
            with folder_lock(tmp_path):  # nested: no self-deadlock
                assert (tmp_path / LOCK_FILE).is_file()
            assert (tmp_path / LOCK_FILE).is_file()  # the outer hold is still there
            raise RuntimeError("boom")
    assert not (tmp_path / LOCK_FILE).exists()
    proc = _start_holder(tmp_path)  # free again for another process
    proc.kill()
    proc.wait()
