"""The support-matrix generator's command line: ``--help`` prints usage (it once wrote the
table into a file named ``--help``), and an output path that looks like an option is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.architectures import matrix

ROOT = Path(__file__).resolve().parents[2]


def test_help_prints_usage_and_writes_nothing(tmp_path):
    got = subprocess.run([sys.executable, "-m", "tests.architectures.matrix", "--help"],
                         cwd=tmp_path, capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert got.returncode == 0, got.stderr
    assert "usage: python -m tests.architectures.matrix" in got.stdout
    assert "--docs" in got.stdout and "--junit" in got.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["-x.md"], ["--", "-out.md"], ["--nonsense"],
                                  ["out.md", "--docs"], ["--junit", "missing.xml"]])
def test_bad_command_lines_are_refused(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        matrix.parse_args(argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_junit_report_becomes_a_table(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuite><testcase name="test_logits_hf_folder[GPT2LMHeadModel]">'
        '<properties><property name="diff" value="3e-07"/></properties></testcase>'
        '<testcase name="test_logits_wrap[GPT2LMHeadModel]"><failure message="KeyError: x|y"/>'
        '</testcase></testsuite>')
    out = tmp_path / "m.md"
    matrix.main(["--junit", str(report), str(out)])
    row = [ln for ln in out.read_text().splitlines() if ln.startswith("| GPT2LMHeadModel")]
    assert len(row) == 1
    cols = len(set(matrix.COLUMNS.values()))
    assert row[0] == "| GPT2LMHeadModel | 3e-07 | ✗ KeyError: x\\|y |" + " – |" * (cols - 2)
