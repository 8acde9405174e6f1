"""Every command's help reads as wrapped prose: no line of it ends where a line of the
command's docstring did (typer keeps a docstring's single line breaks in the command list,
which printed fragments such as ``--verify`` on a line of their own)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from mechsink.app.cli import app, flowing

COMMANDS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def _fragments(lines: list[str], width: int | None = None) -> list[str]:
    """Lines of one wrapped paragraph that ended while the next line's first word still fit:
    text wrapped to its ``width`` (default, and at least: its longest line) never has one."""
    width = max((len(line) for line in lines), default=0) if width is None else width
    return [a for a, b in zip(lines, lines[1:], strict=False)
            if a and b and len(a) + 1 + len(b.split()[0]) <= width]


def _help(*args: str) -> list[str]:
    result = CliRunner().invoke(app, [*args, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output.splitlines()


def test_the_fragment_check_flags_a_line_broken_early() -> None:
    assert _fragments(["one two three four", "five six", "seven"]) == ["five six"]
    assert _fragments(["one two three four", "fivesixseven eight", "nine"]) == []


def test_every_command_help_has_each_paragraph_on_one_line() -> None:
    group = typer.main.get_command(app)
    for name in COMMANDS:
        text = group.commands[name].help or ""  # type: ignore[attr-defined]
        assert text.strip(), f"{name} has no help"
        assert all("\n" not in p for p in text.split("\n\n")), (name, text)
    assert flowing("a\n    b c\n\n    d\n    e") == "a b c\n\nd e"


def test_the_command_list_wraps_each_summary_as_prose() -> None:
    """``mechsink --help``: each command's summary in the Commands panel, wrapped to the
    panel's width with no early break."""
    rows = [line.strip()[1:-1] for line in _help() if line.strip().startswith("│")]
    start = rows.index(next(r for r in rows if r.startswith(" models ")))
    offset = len(rows[start]) - len(rows[start][len(" models"):].lstrip())
    summaries: list[list[str]] = []
    for row in rows[start:]:
        if row[:offset].strip():
            summaries.append([])
        summaries[-1].append(row[offset:].rstrip())
    assert len(summaries) >= 10 and any(len(s) > 3 for s in summaries)
    width = max(len(line) for s in summaries for line in s)
    found = [line for s in summaries for line in _fragments(s, width)]
    assert not found, found


@pytest.mark.parametrize("name", COMMANDS)
def test_a_command_help_wraps_its_description_as_prose(name: str) -> None:
    lines = _help(name)
    usage = next(i for i, line in enumerate(lines) if "Usage:" in line)
    panel = next(i for i, line in enumerate(lines) if line.lstrip().startswith("╭"))
    text = [line.strip() for line in lines[usage + 1:panel]]
    assert any(text), lines
    assert not _fragments(text), _fragments(text)
