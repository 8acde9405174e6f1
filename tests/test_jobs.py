"""Jobs as specs: each option's default exists once (the command line's options and the
sweep's tables read it off the job's spec), and discover runs as a sweep job with the result
``mechsink discover`` gives."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mechsink.app import cli
from mechsink.app.sweep import load_spec, run_sweep
from mechsink.discover.methods import declared_options
from mechsink.errors import BadInputError, MechsinkError
from mechsink.jobs import JOBS, census, discover, job, patch


def _cli_defaults(command) -> dict:
    return {k: getattr(p.default, "default", p.default)
            for k, p in inspect.signature(command).parameters.items()}


@pytest.mark.parametrize("command, spec, renamed", [
    (cli.scan, census.Spec, {"suites": None, "variants": None}),
    (cli.patch, patch.Spec, {"layers": None, "positions": None, "pairs": None,
                             "pairs_per_shard": None}),
    # the methods' options: one flag each, from the registry (test_discover_options.py)
    (cli.discover, discover.Spec, {"metric": None, "method_options": None}),
])
def test_the_command_line_takes_its_defaults_from_the_spec(command, spec, renamed) -> None:
    """Every option of the job the command has, with the spec's default (those it spells
    otherwise, such as --layers 0,2 as text, or a required --metric, aside)."""
    given = _cli_defaults(command)
    checked = 0
    for f in dataclasses.fields(spec):
        if f.name in renamed:
            continue
        assert f.name in given, f.name
        assert given[f.name] == f.default, f.name
        checked += 1
    assert checked >= 5


def test_the_census_vocabulary_is_the_prompts_own() -> None:
    from mechsink.inputs.prompts import SUITES, VARIANTS

    assert census.SUITES == tuple(SUITES) and census.VARIANTS == tuple(VARIANTS)
    assert _cli_defaults(cli.scan)["n"] == 32  # the documented `mechsink scan` default


def test_the_sweep_tables_are_the_specs() -> None:
    """A sweep table takes the spec's options (those of the command line alone left out),
    with the spec's defaults, except where a sweep states its own (census: n 8, BOS only)."""
    assert census.TABLE["n"][1] == 8 and census.TABLE["variants"][1] == ["bos"]
    assert "validate_sets" not in census.TABLE
    assert census.TABLE["seq_len"][1] == census.Spec().seq_len == 64
    for name in JOBS:
        module = job(name)
        fields = {f.name: f for f in dataclasses.fields(module.Spec)}
        for key, (_types, value) in module.TABLE.items():
            if name == "discover" and key in discover.method_table():
                assert value == declared_options()[key].default, key  # the method's own
                continue
            assert fields[key].metadata["sweep"], (name, key)
            if not (name == "census" and key in census.SWEEP_DEFAULTS):
                plain = fields[key].default
                plain = list(plain) if isinstance(plain, tuple) else plain
                if fields[key].default is dataclasses.MISSING:
                    plain = {}
                assert value == plain, (name, key)
    assert "memory_budget" not in patch.TABLE and "pairs" in patch.TABLE


def test_settings_imports_no_experiment() -> None:
    """The validators sit below the experiments: ``mechsink.settings`` imports none of them."""
    source = Path(cli.__file__).parents[1] / "settings.py"
    names = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    assert not any(n.startswith("mechsink.experiments") for n in names), names


@pytest.mark.parametrize("body, line, words", [
    ('metric = "sink_score:1"\nmethod = "nope"\n', 5, "--method must be one of"),
    ('metric = "sink_score:99"\n', 4, "layer 99 is out of range .random:gpt2-tiny"),
    ('metric = "sink_score:1"\nclean = ["The cat"]\ncorrupted = ["The dog", "A cat"]\n', 6,
     "one --corrupted prompt per --clean"),
    ('method = "eap"\n', 1, "needs metric"),
])
def test_a_bad_discover_table_names_its_line_before_any_model_loads(tmp_path, monkeypatch, body,
                                                                     line, words) -> None:
    from mechsink.model import zoo

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the spec was checked")

    monkeypatch.setattr(zoo, "load_model", refuse)
    (tmp_path / "spec.toml").write_text('models = ["random:gpt2-tiny"]\njobs = ["discover"]\n'
                                        "[discover]\n" + body)
    with pytest.raises(BadInputError, match=f"line {line}:.*{words}"):
        load_spec(tmp_path / "spec.toml")


def test_discover_as_a_sweep_job_gives_what_the_command_gives(tmp_path) -> None:
    """The sweep's discover folder holds what ``mechsink discover --out`` writes with the same
    options: the same scores (every edge, bit for bit), circuit and edge list, and the same
    discover.json data."""
    options = {"metric": "sink_score:1", "method": "eap", "n": 2, "seq_len": 8, "verify": 2,
               "export": "tsv"}
    (tmp_path / "spec.toml").write_text(
        'models = ["random:gpt2-tiny"]\njobs = ["discover"]\n[discover]\n'
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in options.items()))
    summary = run_sweep(tmp_path / "spec.toml", tmp_path / "sweep")
    assert summary["ran"] == 1 and summary["failed"] == 0
    index = json.loads((tmp_path / "sweep" / "discover" / "discoveries.json").read_text())
    (entry,) = index["results"]
    assert entry["model"] == "random:gpt2-tiny"
    swept = tmp_path / "sweep" / "discover" / entry["folder"]
    args = ["discover", "random:gpt2-tiny", "--out", str(tmp_path / "cli")]
    for k, v in options.items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    for name in ("scores.safetensors", "circuit.json", "edges.tsv"):
        assert (swept / name).read_bytes() == (tmp_path / "cli" / name).read_bytes(), name
    ours = json.loads((swept / "discover.json").read_text())
    theirs = json.loads((tmp_path / "cli" / "discover.json").read_text())
    assert ours == theirs
    assert entry["edges"] == len(theirs["circuit"]["edges"])
    assert (swept / "circuit.png").is_file()


def test_the_train_job_refuses_bad_values_before_the_run_folder_exists(tmp_path):
    """``mechsink train``'s options are the train job's spec; each bad value is a one-line
    SettingError naming its option, and nothing is written."""
    from mechsink.jobs import train as train_job
    from mechsink.jobs.spec import SettingError

    out = tmp_path / "run"
    bad = {"recipe": {"recipe": "no-such-recipe"}, "seed": {"seed": -1},
           "steps": {"steps": 0}, "out": {"out": " "}}
    for key, change in bad.items():
        spec = train_job.Spec(**{"recipe": "bb-llama-tiny", "out": str(out), **change})
        with pytest.raises(SettingError) as err:
            train_job.check(spec)
        assert err.value.key == key and "\n" not in str(err.value)
    assert not out.exists()
    train_job.check(train_job.Spec(recipe="bb-llama-tiny+hwrms", out=str(out)))


def test_the_train_command_takes_its_defaults_and_help_from_the_spec():
    from typer.testing import CliRunner

    from mechsink.app.cli import app
    from mechsink.jobs import train as train_job
    from mechsink.jobs.spec import help_of

    shown = " ".join(CliRunner().invoke(app, ["train", "--help"], terminal_width=200)
                     .output.split())
    assert help_of(train_job.Spec, "resume") in shown
    assert "seed of the initialisation and of the batches" in shown


def test_the_patch_command_checks_its_pair_in_the_job_before_any_model_loads(monkeypatch):
    """``mechsink patch``'s model-free checks live in the patch job: the layers and positions
    text parsed into the spec, the site and the budget parsed once, and each bad option one
    error naming it, with no model loaded."""
    import mechsink.model.zoo as zoo

    monkeypatch.setattr(zoo, "load_model", lambda *a, **k: pytest.fail("a model loaded"))
    spec = patch.Spec(site="z", metric="sink_score:1", key_position=1, memory_budget="2MiB")
    checked = patch.check_command(spec, "random:gpt2-tiny", "The cat sat", "The dog sat",
                                  layers="0,1", positions="0,2")
    assert checked.spec.layers == (0, 1) and checked.spec.positions == (0, 2)
    assert checked.site.layers == (0, 1) and checked.memory_budget == 2 * 2**20
    assert (checked.clean, checked.corrupted) == ("The cat sat", "The dog sat")
    for options, words in [
        ({"layers": "a"}, "--layers takes comma-separated layer numbers"),
        ({"positions": "-1"}, "--positions: position numbers start at 0"),
        ({"spec": patch.Spec(metric="kl", key_position=1)}, "--key-position is the key"),
        ({"spec": patch.Spec(direction="up")}, "--direction must be"),
        ({"spec": patch.Spec(memory_budget="lots")}, "lots"),
        ({"corrupted": " "}, "--corrupted prompt 1 is empty"),
        ({"corrupted": "The big dog sat down"}, "same number of tokens"),
        ({"model": "random:gpt2-huge"}, "unknown size 'huge'"),
    ]:
        given = {"spec": patch.Spec(), "model": "random:gpt2-tiny", "clean": "The cat sat",
                 "corrupted": "The dog sat", **options}
        with pytest.raises(MechsinkError, match=words):
            patch.check_command(**given)


def test_every_sweep_job_is_checked_before_any_model_loads() -> None:
    from mechsink.app import sweep

    assert sorted(sweep._CHECK_ORDER) == sorted(JOBS)  # a job left out would go unchecked


@pytest.mark.parametrize("spec", [patch.Spec, discover.Spec])
def test_the_metric_help_names_every_metric_string(spec) -> None:
    from mechsink.jobs.spec import help_of
    from mechsink.patching.metrics import METRIC_FORMS

    text = help_of(spec, "metric")
    assert [name for name in METRIC_FORMS if name not in text] == []


def _spec_keywords(command) -> set[str]:
    """The keywords the command's body passes to its job's ``Spec(...)``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(command)))
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == "Spec"]
    assert calls, f"{command.__name__} builds no Spec"
    return {k.arg for call in calls for k in call.keywords if k.arg}


@pytest.mark.parametrize("command, spec, elsewhere", [
    (cli.scan, census.Spec, set()),
    # the sweep's own pairs; --layers / --positions go as text to patch's check_command
    (cli.patch, patch.Spec, {"pairs", "pairs_per_shard", "layers", "positions"}),
    (cli.discover, discover.Spec, set()),
])
def test_the_command_line_hands_its_job_every_option(command, spec, elsewhere) -> None:
    """A spec field the command forgets to pass would keep its default whatever the user
    typed: the command's ``Spec(...)`` names every field a command line has."""
    fields = {f.name for f in dataclasses.fields(spec)}
    assert fields - elsewhere - _spec_keywords(command) == set()
