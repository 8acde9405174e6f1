"""The experiments registry: settings parsed from the command line by run()'s signature, results
that save and load without a model, and `mechsink circuit` refusing bad input before the work."""

from __future__ import annotations

import json
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


def test_every_circuits_script_takes_its_options_and_defaults_from_run() -> None:
    """Each script in circuits/ is its methods section over experiments.script.main: its options
    are run()'s settings with run()'s defaults, and run()'s docstring says what each one is."""
    import inspect

    from mechsink.experiments.script import parser_for, setting_help

    scripts = sorted((Path(__file__).resolve().parents[1] / "circuits").glob("*.py"))
    assert len(scripts) == 7
    for path in scripts:
        experiment = get_experiment(path.stem)
        assert f'main("{path.stem}", __doc__)' in path.read_text()
        settings = {k: p for k, p in experiment.settings().items()
                    if k not in ("model_name", "work_dir")}
        required = [a for k, p in settings.items() if p.default is inspect.Parameter.empty
                    for a in ("--" + k.replace("_", "-"), "x")]
        args = vars(parser_for(experiment, "d").parse_args(["--out", "o", *required]))
        for key, param in settings.items():
            assert setting_help(experiment.run, key), (path.stem, key)
            if param.default is not inspect.Parameter.empty:
                default = param.default
                expected = list(default) if isinstance(default, tuple) else default
                assert args[key] == expected, (path.stem, key)
        if experiment.needs_model:
            assert args["model"] == experiment.default_model and args["device"] == "cpu"
    p0 = parser_for(get_experiment("p0_sink"), "d").parse_args(
        ["--out", "o", "--doses", "0", "0.5", "1", "--layers", "3"])
    assert p0.doses == [0.0, 0.5, 1.0] and p0.layers == 3
