"""benchmarks/faults.py on tiny models: scan, patch and train killed at random moments leave
every result folder whole or absent (#29's fault-injection script)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~70 s on a loaded 2-core machine: 6 processes each start torch
def test_killed_writing_commands_leave_whole_or_absent_folders(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "faults.py"), "--kills",
                           "1", "--seed", "1", "--work", str(tmp_path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    total = re.search(r"\*\*total\*\* \| \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|", done.stdout)
    assert total is not None, done.stdout
    kills, _, checked, inconsistent = map(int, total.groups())
    assert (kills, checked, inconsistent) == (3, 3, 0), done.stdout
    for command in ("scan", "patch", "train"):
        assert f"| {command} |" in done.stdout
