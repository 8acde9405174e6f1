"""A discovery method declares its options beside its code: the registry reads without torch,
checks each declaration against the function, and the pipeline, the job, the sweep's
``[discover]`` table and ``mechsink discover``'s flags all come from the declarations, so a new
option is an edit of the method's file alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer

from mechsink.app import cli
from mechsink.discover.methods import (
    _REGISTRY,
    METHODS,
    VERIFY,
    Option,
    check_options,
    declared_options,
    register,
)
from mechsink.errors import BadInputError
from mechsink.jobs import discover as discover_job
from mechsink.jobs.spec import SettingError

HEAVY = ("torch", "transformer_lens", "transformers", "matplotlib")
ROUNDS = Option("rounds", int, 3, "how many rounds the test method runs", minimum=1)
MODE = Option("mode", str, "fast", "the test method's mode", choices=("fast", "slow"))


@pytest.fixture
def throwaway():
    """A method registered for one test with two options of its own (removed afterwards)."""
    calls: list[dict] = []

    @register("throwaway", options=(ROUNDS, MODE, VERIFY))
    def throwaway(run, *, rounds: int = 3, mode: str = "fast", verify: int = 20):
        """Every edge scored by its sender's number (a test method)."""
        from mechsink.discover.scores import result

        calls.append({"rounds": rounds, "mode": mode, "verify": verify})
        return result(run, run.graph.src.double(), "throwaway", {})

    try:
        yield calls
    finally:
        _REGISTRY.pop("throwaway")


def test_listing_every_methods_options_imports_no_torch() -> None:
    code = ("from mechsink.discover.methods import METHODS, declared_options\n"
            "names = [o.name for m in METHODS.values() for o in m.declared]\n"
            "assert 'steps' in names and declared_options(command_line=True)\n"
            "import json, sys\n"
            f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == dict.fromkeys(HEAVY, False)


def test_every_keyword_option_is_declared_with_its_default() -> None:
    def fn(run, *, rounds: int = 3):
        return None

    with pytest.raises(ValueError, match="takes rounds without declaring"):
        register("undeclared")(fn)
    with pytest.raises(ValueError, match="declares mode, which it does not take"):
        register("extra", options=(ROUNDS, MODE))(fn)
    with pytest.raises(ValueError, match="declared with default 4"):
        register("other-default", options=(Option("rounds", int, 4, "rounds"),))(fn)
    with pytest.raises(ValueError, match="command-line option"):
        Option("edges", list, None, "edge indices")
    assert not {"undeclared", "extra", "other-default"} & set(_REGISTRY)
    for method in METHODS.values():
        assert method.options == tuple(o.name for o in method.declared)


def test_one_option_name_means_one_thing() -> None:
    """Options shared by several methods are declared once; two declarations of one name
    that differ are refused when the options are read."""
    assert METHODS["eap"].option("qk_fix") is METHODS["eap-ig"].option("qk_fix")
    assert METHODS["exact"].option("edges") is METHODS["eap-ig"].option("edges")
    register("other-verify", options=(Option("verify", int, 0, "edges to re-check"),))(
        lambda run, *, verify=0: None)
    try:
        with pytest.raises(ValueError, match="'verify' is declared as"):
            declared_options()
    finally:
        _REGISTRY.pop("other-verify")


def test_the_pipeline_checks_a_new_option_from_its_declaration(throwaway, llama_tiny) -> None:
    import torch

    from mechsink.discover import discover
    from mechsink.patching import SinkScore

    g = torch.Generator().manual_seed(0)
    clean, corr = (torch.randint(5, 500, (2, 7), generator=g) for _ in range(2))
    assert check_options("throwaway", {"rounds": 5}) == {"rounds": 5, "mode": "fast",
                                                         "verify": 20}
    assert check_options("throwaway", {"steps": 2}) == {"rounds": 3, "mode": "fast",
                                                        "verify": 20}  # eap-ig's, left out
    for options, words in (({"rounds": 0}, "rounds must be at least 1, got 0"),
                           ({"rounds": "2"}, "rounds must be an int, got '2'"),
                           ({"rounds": True}, "rounds must be an int"),
                           ({"mode": "lazy"}, "mode must be fast or slow, got 'lazy'"),
                           ({"steps": 0}, "steps must be at least 1"),
                           ({"stpes": 2}, "'throwaway' takes rounds, mode, verify, not stpes")):
        with pytest.raises(BadInputError, match=words):
            discover(llama_tiny, clean, SinkScore(1), corrupted=corr, method="throwaway",
                     **options)
    found = discover(llama_tiny, clean, SinkScore(1), corrupted=corr, method="throwaway",
                     rounds=7, mode="slow", steps=2, n_random=0, n_edges=3)
    assert found.scores.method == "throwaway"
    assert throwaway == [{"rounds": 7, "mode": "slow", "verify": 20}]


def test_the_sweep_table_and_the_job_know_a_new_option(throwaway, tmp_path, monkeypatch):
    from mechsink.app.sweep import load_spec
    from mechsink.model import zoo

    assert discover_job.TABLE["rounds"] == ((int,), 3)
    assert discover_job.TABLE["mode"] == ((str,), "fast")
    assert discover_job.TABLE["steps"] == ((int,), 5) and "batch_size" not in discover_job.TABLE
    spec = discover_job.Spec(metric="kl", method="throwaway",
                             method_options={"rounds": 0})
    with pytest.raises(SettingError, match="--rounds must be at least 1, got 0"):
        discover_job.check(spec)
    with pytest.raises(SettingError, match="--mode must be fast or slow"):
        discover_job.check(discover_job.Spec(metric="kl", method_options={"mode": "x"}))

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the spec was checked")

    monkeypatch.setattr(zoo, "load_model", refuse)
    head = 'models = ["random:gpt2-tiny"]\njobs = ["discover"]\n[discover]\n'
    body = 'metric = "sink_score:1"\nmethod = "throwaway"\n'
    (tmp_path / "spec.toml").write_text(head + body + "rounds = 4\n")
    given = discover_job.Spec.from_settings(load_spec(tmp_path / "spec.toml").settings[
        "discover"])
    assert given.method == "throwaway"
    assert given.method_options == {"qk_fix": True, "verify": 20, "steps": 5,
                                    "ig": "activations", "convention": "mechsink",
                                    "rounds": 4, "mode": "fast"}
    (tmp_path / "spec.toml").write_text(head + body + "rounds = 0\n")
    with pytest.raises(BadInputError, match="line 6:.*--rounds must be at least 1"):
        load_spec(tmp_path / "spec.toml")
    (tmp_path / "spec.toml").write_text(head + body + 'rounds = "4"\n')
    with pytest.raises(BadInputError, match="line 6:.*rounds must be int"):
        load_spec(tmp_path / "spec.toml")


def test_the_command_line_offers_every_command_line_option() -> None:
    """``mechsink discover`` has a flag per command-line option of the registry (as loaded
    when the command line was built), with the declared default and help; a bool is
    ``--x/--no-x``; API-only options are not flags."""
    command = typer.main.get_command(cli.app).commands["discover"]
    params = {p.name: p for p in command.params if isinstance(p, typer.core.TyperOption)}
    for name, option in declared_options(command_line=True).items():
        param = params[name]
        assert param.default == option.default and param.help == option.help, name
        flag = "--" + name.replace("_", "-")
        assert param.opts == [flag], name
        if option.type is bool:
            assert param.secondary_opts == ["--no-" + name.replace("_", "-")], name
    assert "batch_size" not in params
    assert {"steps", "ig", "qk_fix", "convention", "verify"} <= set(params)


def test_the_command_line_hands_the_options_to_the_job(monkeypatch, tmp_path) -> None:
    """The flags reach the job's spec as its method options, checked before any model loads."""
    from typer.testing import CliRunner

    seen = {}

    def stop(spec, models, option):
        seen["options"] = dict(spec.method_options)
        raise BadInputError("stop here")

    monkeypatch.setattr(discover_job, "check", stop)
    result = CliRunner().invoke(cli.app, ["discover", "random:gpt2-tiny", "--metric", "kl",
                                          "--out", str(tmp_path / "o"), "--steps", "9",
                                          "--no-qk-fix", "--ig", "inputs"])
    assert result.exit_code != 0 and "stop here" in result.output
    assert seen["options"] == {"qk_fix": False, "verify": 20, "steps": 9, "ig": "inputs",
                               "convention": "mechsink"}
