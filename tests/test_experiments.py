"""The experiments registry: settings parsed from the command line by run()'s signature, results
that save and load without a model, and `mechsink experiment` refusing bad input before the work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mechsink.app.cli import app
from mechsink.errors import BadInputError
from mechsink.experiments import EXPERIMENTS, ExperimentResult, get_experiment


def test_every_experiment_has_run_summary_and_a_schema_constant() -> None:
    for experiment in EXPERIMENTS.values():
        module = experiment.module
        assert callable(module.run) and callable(module.summary), experiment.name
        assert experiment.settings(), experiment.name  # keyword settings to set from the CLI
        assert ("model_name" in experiment.settings()) == experiment.needs_model


def test_settings_are_typed_by_the_signature() -> None:
    origin = get_experiment("structural_origin")
    assert origin.parse_settings(["--n", "4", "--seq-len", "32", "--positions", "8", "16",
                                  "--doses", "0", "1.5"]) == {
        "n": 4, "seq_len": 32, "positions": [8, 16], "doses": [0.0, 1.5]}
    assert get_experiment("p0_sink").parse_settings(["--layers", "3"]) == {"layers": 3}
    with pytest.raises(BadInputError, match="--seq-len"):  # the message lists the options
        origin.parse_settings(["--seqlen", "3"])
    with pytest.raises(BadInputError, match="wants int"):
        origin.parse_settings(["--n", "four"])
    with pytest.raises(BadInputError, match="one value"):
        origin.parse_settings(["--n", "1", "2"])
    with pytest.raises(BadInputError, match="unknown experiment 'nope'"):
        get_experiment("nope")


def test_a_saved_result_renders_again_without_a_model(tmp_path: Path) -> None:
    data = {"schema": "mechsink-timeline/1", "run": "r", "eps": 0.3, "points": [
        {"step": 0, "loss": None, "sink_rate": 0.1, "sink_rate_no_self": 0.05,
         "max_sink_score": 0.4, "first_token_norm_ratio": 1.5, "max_abs_resid": 3.0},
        {"step": 2, "loss": 2.5, "sink_rate": 0.5, "sink_rate_no_self": 0.25,
         "max_sink_score": 0.9, "first_token_norm_ratio": 4.0, "max_abs_resid": 9.0}]}
    result = ExperimentResult("sink_timeline", data)
    out = result.save(tmp_path / "t")
    assert json.loads((out / "timeline.json").read_text())["experiment"] == "sink_timeline"
    assert (out / "timeline.png").stat().st_size > 5_000
    again = ExperimentResult.load(out, "sink_timeline")
    assert again.data == data and again.summary() == (out / "summary.md").read_text()
    assert "| 2 | 2.500 | 0.250 | 0.900 | 4.00 | 9.00 |" in again.summary()


def test_circuit_command_checks_the_output_folder_before_loading(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["circuit", "structural_origin", "random:llama-tiny", "--n", "2"]
    file = tmp_path / "a-file"
    file.write_text("x")
    bad = runner.invoke(app, [*args, "--out", str(file)])
    assert bad.exit_code == 2 and "is a file" in bad.output
    empty = runner.invoke(app, [*args, "--out", ""])
    assert empty.exit_code == 2 and "empty" in empty.output
    model_for_trainer = runner.invoke(app, ["circuit", "seedprint", "random:llama-tiny",
                                            "--out", str(tmp_path / "s")])
    assert model_for_trainer.exit_code == 2 and "takes no model" in model_for_trainer.output
    held = tmp_path / "held"
    holder = subprocess.Popen(  # another process holds the folder (one process may nest)
        [sys.executable, "-c", "import sys, time\nfrom mechsink.io import folder_lock\n"
         f"with folder_lock({str(held)!r}, command='another mechsink run'):\n"
         "    print('held', flush=True)\n    time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        locked = runner.invoke(app, [*args, "--out", str(held)])
    finally:
        holder.kill()
        holder.wait()
    assert locked.exit_code == 2 and "another mechsink run" in locked.output
    assert not (held / "result.json").exists()


def test_a_circuits_script_holds_its_output_folder_as_the_command_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A script and ``mechsink experiment`` share one run body: another run's folder is
    refused (naming that run) before any model loads, and a file is refused as --out."""
    from mechsink.experiments.script import main

    args = ["--model", "random:llama-tiny", "--n", "2", "--seq-len", "40"]
    file = tmp_path / "a-file"
    file.write_text("x")
    with pytest.raises(SystemExit) as bad:
        main("structural_origin", "doc", [*args, "--out", str(file)])
    assert bad.value.code == 2 and "is a file" in capsys.readouterr().err
    held = tmp_path / "held"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom mechsink.io import folder_lock\n"
         f"with folder_lock({str(held)!r}, command='another mechsink run'):\n"
         "    print('held', flush=True)\n    time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit) as locked:
            main("structural_origin", "doc", [*args, "--out", str(held)])
    finally:
        holder.kill()
        holder.wait()
    assert locked.value.code == 2 and "another mechsink run" in capsys.readouterr().err
    assert not (held / "result.json").exists()


def test_every_circuits_script_takes_its_options_and_defaults_from_run() -> None:
    """Each script in circuits/ is its methods section over experiments.script.main: its options
    are run()'s settings with run()'s defaults, and run()'s docstring says what each one is."""
    import inspect

    from mechsink.experiments.script import parse_args

    scripts = sorted((Path(__file__).resolve().parents[1] / "circuits").glob("*.py"))
    assert len(scripts) == 11  # every experiment but p0_edges (run by `mechsink experiment`)
    for path in scripts:
        experiment = get_experiment(path.stem)
        assert f'main("{path.stem}", __doc__)' in path.read_text()
        options = experiment.options()
        assert set(options) == set(experiment.settings()) - {"model_name", "work_dir"}
        for key, option in options.items():
            assert option.help, (path.stem, key)
            assert option.default == experiment.settings()[key].default, (path.stem, key)
        required = [a for k, o in options.items() if o.default is inspect.Parameter.empty
                    for a in (o.flag, "x")]
        args = parse_args(experiment, ["--out", "o", *required])
        assert args["out"] == "o" and not set(args) & (set(options) - {"run_dir"})
        if experiment.needs_model:
            assert args["model"] == experiment.default_model and args["device"] == "cpu"
    p0 = parse_args(get_experiment("p0_sink"), ["--out", "o", "--doses", "0", "0.5", "1",
                                                "--layers=3", "--model", "random:gpt2-tiny"])
    assert p0["doses"] == [0.0, 0.5, 1.0] and p0["layers"] == 3
    assert p0["model"] == "random:gpt2-tiny" and p0["seed"] is None


def test_a_script_and_the_command_parse_alike_and_fail_in_one_line(tmp_path: Path,
                                                                  capsys) -> None:
    """One parser: a circuits/ script refuses bad options with the messages `mechsink
    experiment` gives, as one line on stderr (status 2), before any model loads."""
    from mechsink.experiments.script import main

    cases = [(["--seq-len", "abc"], "structural_origin --seq-len wants int values, got abc."),
             (["--seq-len", "0"], "structural_origin --seq-len must be at least 1, got 0."),
             (["--n", "1", "2"], "structural_origin --n takes one value, got 2."),
             (["--seq", "8"], "structural_origin has no option --seq: its options are --n, "
                              "--seq-len,")]
    runner = CliRunner()
    for given, message in cases:
        with pytest.raises(SystemExit) as exit_:
            main("structural_origin", "d", ["--out", str(tmp_path / "o"), *given])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
        cli = runner.invoke(app, ["experiment", "structural_origin", "random:gpt2-tiny",
                                  "--out", str(tmp_path / "o"), *given])
        assert cli.exit_code == 2 and message in " ".join(cli.output.split()), cli.output
    with pytest.raises(SystemExit):
        main("sink_timeline", "d", ["--out", str(tmp_path / "o")])
    assert "sink_timeline needs --run-dir" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    # as a script on the command line: no traceback, and --help lists --out and the settings
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    script = [sys.executable, str(repo / "circuits" / "structural_origin.py")]
    ran = subprocess.run([*script, "--out", str(tmp_path / "o"), "--seq-len", "0"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert ran.stderr.strip() == "error: structural_origin --seq-len must be at least 1, got 0."
    listed = subprocess.run([*script, "--help"], env=env, capture_output=True, text=True,
                            timeout=120).stdout
    assert "--out STR  (required)" in listed and "--model STR  (default: smollm2-135m)" in listed
    assert "--positions INT ...  (default: 4 8 32)  positions k the sink is moved to" in listed


# --- `mechsink experiment`: settings listed, given without a model, checked first (#29 11, 13) --


@pytest.fixture()
def no_load(monkeypatch):
    """Fail the test if a command loads a model (bad input must stop before that)."""
    from mechsink.model import zoo

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the settings were checked")

    monkeypatch.setattr(zoo, "load_model", refuse)


def test_circuit_name_help_lists_the_experiments_settings(no_load) -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["circuit", "structural_origin", "--help"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    for option in get_experiment("structural_origin").settings():
        if option != "model_name":
            assert "--" + option.replace("_", "-") in text, option
    assert "--positions INT ... (default: 4 8 32) positions k the sink is moved to" in text
    timeline = " ".join(runner.invoke(app, ["circuit", "sink_timeline", "--help"]).output.split())
    assert "--run-dir STR (required)" in timeline and "takes no model" in timeline


def test_circuit_settings_without_a_model_reach_the_experiment(tmp_path: Path) -> None:
    from mechsink.io import check_result_set
    from mechsink.training.loop import train

    run = train("bb-llama-tiny", tmp_path / "run", steps=2, progress=False)
    out = tmp_path / "timeline"
    result = CliRunner().invoke(app, ["circuit", "sink_timeline", "--run-dir", str(run),
                                      "--n", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "timeline.json").read_text())
    assert saved["experiment"] == "sink_timeline" and saved["run"] == str(run)
    assert [p["step"] for p in saved["points"]] == json.loads(
        (run / "run.json").read_text())["checkpoints"]
    assert set(check_result_set(out, full=True)["files"]) == {"timeline.json", "timeline.png",
                                                              "summary.md"}


@pytest.mark.parametrize("args, needles", [
    (["structural_origin", "random:llama-tiny", "--n", "-4"], ["--n must be at least 1"]),
    (["structural_origin", "random:llama-tiny", "--seq-len", "5000"],
     ["--seq-len 5000 is longer than the model's context", "256 tokens"]),
    (["gpt2_query_bias", "--top", "999"], ["--top 999 is more than the model's 8 heads"]),
    (["sink_timeline", "--n", "4"], ["sink_timeline needs --run-dir"]),
    (["structural_origin", "random:llama-tiny", "--n", "4", "--seq-len", "32"],
     ["--positions (default: 4 8 32) has 32 outside the sequence", "--seq-len 32"]),
    (["seedprint", "--steps", "-1"], ["seedprint --steps must be at least 1"]),
    (["p0_sink", "random:llama-tiny", "--batch-size", "0"], ["--batch-size must be at least 1"]),
])
def test_circuit_settings_are_checked_before_any_model_loads(tmp_path, no_load, args, needles):
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["circuit", *args, "--out", str(out)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    text = " ".join(result.output.split())
    assert text.startswith("error:") and "Traceback" not in text, text
    for needle in needles:
        assert needle in text, text
    assert not out.exists()  # nothing written, no folder made


def test_the_experiment_command_is_listed_and_circuit_still_runs_it() -> None:
    names = {c.name or c.callback.__name__ for c in app.registered_commands if not c.hidden}
    assert "experiment" in names and "circuit" not in names
    old = CliRunner().invoke(app, ["circuit", "sink_timeline", "--help"]).output
    assert old == CliRunner().invoke(app, ["experiment", "sink_timeline", "--help"]).output
    assert "mechsink experiment sink_timeline --out DIR" in old
