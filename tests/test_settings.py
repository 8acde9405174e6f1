"""One validation for every setting (mechsink.settings): the CLI, `mechsink experiment`, the
sweep's spec check and the experiments give the same one-line message, before any model loads
(#29 items 10, 16 and "one validation for every setting")."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from mechsink import settings
from mechsink.app.cli import app
from mechsink.app.sweep import load_spec
from mechsink.errors import BadInputError
from mechsink.experiments.options import check_experiment_settings


@pytest.fixture()
def no_load(monkeypatch):
    from mechsink.model import zoo

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(zoo, "load_model", refuse)


def _line(args: list[str]) -> str:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    text = " ".join(result.output.split())
    assert text.startswith("error:") and "Traceback" not in text, text
    return text


def _message(fn, *args, **kwargs) -> str:
    with pytest.raises(BadInputError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_the_cli_and_the_sweep_give_the_checks_own_message(tmp_path: Path, no_load) -> None:
    core = "eps must lie strictly between 0 and 1, got 5"
    assert core in _message(settings.check_eps, 5)
    assert core in _line(["scan", "random:gpt2-tiny", "--out", str(tmp_path / "s"), "--eps",
                          "5"])
    (tmp_path / "spec.toml").write_text('models = ["random:gpt2-tiny"]\njobs = ["census"]\n'
                                        "[census]\neps = 5\n")
    assert core in _message(load_spec, tmp_path / "spec.toml")
    too_long = "is longer than the model's context (random:gpt2-tiny: 256 tokens)"
    assert too_long in _message(settings.check_context, "random:gpt2-tiny", 5000)
    assert too_long in _line(["scan", "random:gpt2-tiny", "--out", str(tmp_path / "s"),
                              "--seq-len", "5000"])
    assert too_long in _line(["circuit", "structural_origin", "random:gpt2-tiny", "--seq-len",
                              "5000", "--out", str(tmp_path / "c")])


def test_non_utf8_bytes_in_a_command_line_prompt_are_one_line(tmp_path: Path, no_load) -> None:
    bad = "caf\udce9"  # how Python hands over the byte 0xe9 of a non-UTF-8 argv
    assert "character 4" in _message(settings.check_text, bad, "--clean")
    text = _line(["patch", "random:gpt2-tiny", "--clean", bad, "--corrupted", "cafe", "--out",
                  str(tmp_path / "p")])
    assert "--clean holds a byte that is not UTF-8" in text
    text = _line(["info", "random:gpt2-tiny", "--prompt", bad])
    assert "--prompt holds a byte that is not UTF-8" in text
    assert not (tmp_path / "p").exists()


def test_prompt_pairs_and_directions() -> None:
    assert "no prompt pairs" in _message(settings.check_pairs, [])
    assert "pair 2 must be two non-empty" in _message(settings.check_pairs,
                                                      [("a", "b"), ("a", " ")])
    assert "not UTF-8" in _message(settings.check_pairs, [("a", "b\udcff")])
    settings.check_pairs([("The cat", "The dog")])
    assert "denoise or noise" in _message(settings.check_direction, "up")
    settings.check_direction("noise")


@pytest.mark.parametrize("name, given, words", [
    ("structural_origin", {"n": 0}, "--n must be at least 1, got 0"),
    ("structural_origin", {"doses": [0.0, -1.0]}, "--doses must be 0 or more, got -1.0"),
    ("structural_origin", {"positions": [4, 70]}, "--positions (given: 4 70) has 70 outside"),
    ("p0_sink", {"seq_len": 1}, "--seq-len must be at least 2"),
    ("sink_timeline", {"run_dir": "r", "eps": 1.5}, "eps must lie strictly between 0 and 1"),
    ("sink_timeline", {"run_dir": "r", "n": 2, "eps": float("nan")}, "finite number"),
    ("headwise_rmsnorm", {"seeds": [0, -1]}, "--seeds must be 0 or more, got -1"),
])
def test_experiment_settings_are_checked_with_their_options(name, given, words) -> None:
    assert words in _message(check_experiment_settings, name, given)


def test_experiment_settings_against_the_model() -> None:
    assert "--top 99 is more than the model's 8 heads" in _message(
        check_experiment_settings, "gpt2_query_bias", {"top": 99},
        model="random:gpt2-tiny")
    check_experiment_settings("gpt2_query_bias", {"top": 8}, model="random:gpt2-tiny")
    check_experiment_settings("structural_origin", {"seq_len": 64},
                              model="random:llama-tiny")
