"""Bad input, tracebacks and late failures: each case is one line (a mechsink error, exit status
2, no traceback), raised before any model loads or organism trains, with nothing left on disk."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mechsink import settings
from mechsink.app.cli import app
from mechsink.app.sweep import load_spec, run_sweep
from mechsink.errors import BadInputError


@pytest.fixture()
def no_load(monkeypatch):
    """Fail the test if a command loads a model (bad input must stop before that)."""
    from mechsink.model import zoo

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(zoo, "load_model", refuse)


@pytest.fixture()
def no_training(monkeypatch):
    """Fail the test if an organism starts training (bad input must stop before that)."""
    from mechsink.training import loop

    def refuse(*args, **kwargs):
        raise AssertionError("training started before the input was checked")

    monkeypatch.setattr(loop, "train", refuse)


def _line(args: list[str]) -> str:
    """The command's one-line error (exit status 2, no traceback), whitespace joined."""
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    text = " ".join(result.output.split())
    assert text.startswith("error:") and "Traceback" not in text, text
    assert text.count("error:") == 1, text
    return text


def _spec_error(tmp_path: Path, body: str, files: dict[str, str] | None = None) -> str:
    """The sweep's refusal of spec ``body`` (models: random:gpt2-tiny), before any work."""
    for name, text in (files or {}).items():
        (tmp_path / name).write_text(text)
    (tmp_path / "spec.toml").write_text('models = ["random:gpt2-tiny"]\n' + body)
    with pytest.raises(BadInputError) as info:
        run_sweep(tmp_path / "spec.toml", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    message = str(info.value)
    assert "\n" not in message, message
    return message


def _gpt2_lengths(*texts: str) -> list[int]:
    """Token counts from transformers' own GPT-2 tokenizer (what random:gpt2-* models use)."""
    from transformers import AutoTokenizer

    from mechsink.model.zoo.tokenizer import gpt2_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(str(gpt2_tokenizer_dir()))
    return [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]


PAIR_LINE = '{"clean": "The cat sat on the mat", "corrupted": "The dog sat on the mat"}\n'
PATCH = 'jobs = ["patch"]\n[patch]\npairs = "p.jsonl"\nmetric = "sink_score:1"\n'


# --- 6: prompts in a pairs file are strings, never coerced --------------------------------------


@pytest.mark.parametrize("entry, shown", [
    ('{"clean": 12, "corrupted": 13}', '"clean" must be a string (the prompt\'s text in quotes), '
                                       "got 12"),
    ('{"clean": "The cat", "corrupted": 13}', '"corrupted" must be a string'),
    ('{"clean": 5, "corrupted": ["x"]}', '"clean" must be a string'),
    ('{"clean": "The cat", "corrupted": ["x"]}', '"corrupted" must be a string (the prompt\'s '
                                                 'text in quotes), got ["x"]'),
])
def test_sweep_pairs_that_are_not_strings_are_refused_naming_the_entry(tmp_path, no_load,
                                                                        entry, shown):
    message = _spec_error(tmp_path, PATCH, {"p.jsonl": PAIR_LINE + entry + "\n"})
    assert f"p.jsonl, line 2: {shown}" in message  # the second line of the file
    assert "spec.toml, line 4" in message  # where the spec names the file


# --- 9: one line, before the model loads --------------------------------------------------------


def test_info_tokens_past_the_context_is_one_line_before_loading(no_load):
    # "The capital of France is": 5 GPT-2 tokens, and BOS: 6; random:gpt2-tiny holds 256
    assert _gpt2_lengths("The capital of France is") == [5]
    text = _line(["info", "random:gpt2-tiny", "--tokens", "5000"])
    assert "--tokens 5000 after the prompt's 6 tokens makes 5006" in text
    assert "context (random:gpt2-tiny: 256 tokens): give --tokens 250 or fewer" in text
    assert "give --tokens 251 or fewer" not in text
    assert "250 or fewer" in _line(["info", "random:gpt2-tiny", "--tokens", "251"])
    text = _line(["info", "random:gpt2-tiny", "--tokens", "300", "--no-prepend-bos",
                  "--prompt", "The capital of France"])  # 4 tokens, no BOS
    assert "4 tokens makes 304" in text and "give --tokens 252 or fewer" in text
    # 250 fits: the command goes on to load the model (refused here by the fixture)
    result = CliRunner().invoke(app, ["info", "random:gpt2-tiny", "--tokens", "250"])
    assert "the model was loaded" in str(result.exception)


def test_the_corpus_count_is_the_corpus():
    from mechsink.inputs.corpus import NATURAL_TEXTS, natural_documents

    assert len(natural_documents()) == NATURAL_TEXTS


def test_scan_asking_more_natural_texts_than_the_corpus_holds(tmp_path, no_load):
    from mechsink.inputs.corpus import NATURAL_TEXTS

    text = _line(["scan", "random:gpt2-tiny", "--n", "100000", "--suite", "natural", "--out",
                  str(tmp_path / "s")])
    assert f"--n 100000 is more than the natural corpus holds ({NATURAL_TEXTS} texts" in text
    assert f"give --n {NATURAL_TEXTS} or less" in text
    assert not (tmp_path / "s").exists()
    # other suites draw as many as asked; an organism of a synthetic task draws from its task
    for args in (["random:gpt2-tiny", "--suite", "random"],
                 ["organism:bb-gpt2-tiny", "--suite", "natural"]):
        result = CliRunner().invoke(app, ["scan", *args, "--n", "100000", "--out",
                                          str(tmp_path / "s")])
        assert "the model was loaded" in str(result.exception), result.output


def test_scan_with_too_few_long_texts_is_one_line_after_loading(tmp_path):
    """The corpus holds fewer texts of 200 tokens than of 64: found once the tokenizer is
    there (loaded with the model), still one line and no result."""
    text = _line(["scan", "random:gpt2-tiny", "--n", "4400", "--seq-len", "200", "--suite",
                  "natural", "--variant", "bos", "--device", "cpu", "--out",
                  str(tmp_path / "s")])
    assert "the natural corpus holds only" in text and "texts of at least 200 tokens" in text
    assert not (tmp_path / "s").exists()


def _pickled_folder(folder: Path, marker: Path) -> Path:
    """A GPT-2 folder (config, real tokenizer) whose pytorch_model.bin pickles a call that
    would create ``marker`` when unpickled without weights_only."""
    import torch
    from transformers import GPT2Config

    from mechsink.model.zoo.tokenizer import gpt2_tokenizer

    class Payload:
        def __reduce__(self):
            return os.mkdir, (str(marker),)

    GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=64).save_pretrained(folder)
    gpt2_tokenizer().save_pretrained(folder)
    torch.save({"transformer.wte.weight": Payload()}, folder / "pytorch_model.bin")
    return folder


def test_a_pickled_payload_in_the_weights_is_refused_in_one_line(tmp_path):
    marker = tmp_path / "the-payload-ran"
    folder = _pickled_folder(tmp_path / "model", marker)
    text = _line(["info", f"hf:{folder}", "--device", "cpu"])
    assert "its pickled weights (a .bin file) were refused (it asks for posix.mkdir)" in text
    assert "none of its code ran" in text and "model.safetensors" in text
    assert not marker.exists()


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999", str(2**32)])
def test_train_seed_out_of_range_writes_nothing(tmp_path, seed):
    text = _line(["train", "bb-llama-tiny", "--steps", "1", "--out", str(tmp_path / "r"),
                  f"--seed={seed}"])
    assert f"--seed must be an integer from 0 to 4294967295 (2**32-1), got {seed}." in text
    assert not (tmp_path / "r").exists()


def test_seed_range_bounds_and_the_library_call(tmp_path):
    from mechsink.training.loop import train

    settings.check_seed(0)
    settings.check_seed(2**32 - 1)
    for bad in (-1, 2**32, 1.5, True, "3"):
        with pytest.raises(BadInputError, match="from 0 to 4294967295"):
            settings.check_seed(bad)
    with pytest.raises(BadInputError, match="data_seed must be"):
        train("bb-llama-tiny", tmp_path / "r", steps=1, seed=0, data_seed=-5)
    assert not (tmp_path / "r").exists()


def test_sink_timeline_run_dir_missing_or_a_file(tmp_path, no_training):
    out = tmp_path / "out"
    text = _line(["circuit", "sink_timeline", "--run-dir", str(tmp_path / "nope"), "--out",
                  str(out)])
    assert f"sink_timeline --run-dir {tmp_path / 'nope'} does not exist" in text
    (tmp_path / "f").write_text("x")
    text = _line(["circuit", "sink_timeline", "--run-dir", str(tmp_path / "f"), "--out",
                  str(out)])
    assert "is a file: give the folder a mechsink train run wrote" in text
    (tmp_path / "empty").mkdir()
    assert "holds no run.json" in _line(["circuit", "sink_timeline", "--run-dir",
                                         str(tmp_path / "empty"), "--out", str(out)])
    assert not out.exists()


@pytest.mark.parametrize("body, words", [
    ('jobs = ["experiment"]\n[experiment]\nname = "structural_origin"\n'
     "[experiment.settings]\npositions = 3\n",
     "line 6: [experiment.settings] structural_origin --positions takes a list of int values "
     "(e.g. [8, 16]), got 3."),
    ('jobs = ["experiment"]\n[experiment]\nname = "structural_origin"\n'
     '[experiment.settings]\nn = "four"\n',
     "line 6: [experiment.settings] structural_origin --n takes one int, got 'four'."),
    ('jobs = ["experiment"]\n[experiment]\nname = "structural_origin"\n'
     '[experiment.settings]\ndoses = [0.0, "x"]\n', "--doses takes a list of float values"),
    (PATCH + 'layers = ["a"]\n', "line 6: [patch] layers must be a non-empty list of layer "
                                 "numbers (integers such as [0, 2, 5]), got ['a']."),
], ids=["positions-int", "n-str", "doses-str", "layers-str"])
def test_sweep_setting_of_the_wrong_type_names_key_and_type(tmp_path, no_load, body, words):
    assert words in _spec_error(tmp_path, body, {"p.jsonl": PAIR_LINE})


# --- 10: what every shard would find out at run time, found at spec time ------------------------


@pytest.mark.parametrize("body, line", [
    ('jobs = ["census"]\n[census]\nn = 5000\n', 4),
    ('jobs = ["timeline"]\n[timeline]\nsuite = "natural"\nn = 5000\n', 5),
], ids=["census", "timeline"])
def test_sweep_natural_n_past_the_corpus(tmp_path, no_load, body, line):
    from mechsink.inputs.corpus import NATURAL_TEXTS

    message = _spec_error(tmp_path, body)
    assert f"line {line}:" in message
    assert f"n 5000 is more than the natural corpus holds ({NATURAL_TEXTS} texts" in message


@pytest.mark.parametrize("extra, words", [
    ("layers = [99]\n", "line 6: [patch] layers: layer 99 is out of range (random:gpt2-tiny "
                        "has 2 layers, numbered 0..1)."),
    ("layers = [0, -1]\n", "layer numbers start at 0"),
], ids=["layer-99", "negative"])
def test_sweep_patch_layers_against_the_models_config(tmp_path, no_load, extra, words):
    assert words in _spec_error(tmp_path, PATCH + extra, {"p.jsonl": PAIR_LINE})


def test_sweep_metric_against_each_models_config(tmp_path, no_load):
    body = PATCH.replace("sink_score:1", "sink_score:99")
    message = _spec_error(tmp_path, body, {"p.jsonl": PAIR_LINE})
    assert "line 5: [patch] sink_score: layer 99 is out of range (random:gpt2-tiny has layers " \
           "0..1)." in message
    body = PATCH.replace("sink_score:1", "sink_score:1:4")  # gpt2-tiny has heads 0..3
    assert "head 4 is out of range (0..3)" in _spec_error(tmp_path, body,
                                                          {"p.jsonl": PAIR_LINE})
    # a second model with more layers: the check is per model
    (tmp_path / "spec.toml").write_text('models = ["random:gpt2-tiny", "random:llama-mini"]\n'
                                        + PATCH.replace("sink_score:1", "sink_score:3"))
    with pytest.raises(BadInputError, match=r"layer 3 is out of range \(random:gpt2-tiny"):
        load_spec(tmp_path / "spec.toml")


def test_sweep_pairs_of_different_lengths_are_refused_with_the_counts(tmp_path, no_load):
    clean, corrupted = "The cat sat on the", "A much longer corrupted prompt here"
    a, b = _gpt2_lengths(clean, corrupted)
    assert a != b
    lines = PAIR_LINE + json.dumps({"clean": clean, "corrupted": corrupted}) + "\n"
    message = _spec_error(tmp_path, PATCH, {"p.jsonl": lines})
    assert (f"line 4: [patch] prompt-pair file p.jsonl: pair 2 tokenises to {a} and {b} tokens "
            "with random:gpt2-tiny's tokenizer") in message
    assert "same number of tokens" in message


def test_sweep_threads_capped_at_the_cores(tmp_path, no_load):
    cores = os.cpu_count()
    message = _spec_error(tmp_path, 'jobs = ["census"]\nthreads = 100000\n')
    assert (f"line 3: threads must be an integer from 1 to {cores} (this machine's cores), "
            "got 100000.") in message
    (tmp_path / "spec.toml").write_text(f'models = ["random:gpt2-tiny"]\njobs = ["census"]\n'
                                        f"threads = {cores}\n")
    assert load_spec(tmp_path / "spec.toml").threads == cores


def test_seedprint_alpha_and_null_inits_refused_before_training(tmp_path, no_training):
    text = _line(["circuit", "seedprint", "--alpha", "5", "--out", str(tmp_path / "o")])
    assert "seedprint --alpha (a false-positive rate) must lie strictly between 0 and 0.5, " \
           "got 5.0." in text
    text = _line(["circuit", "seedprint", "--null-inits", "2", "--out", str(tmp_path / "o")])
    assert "seedprint --null-inits must be at least 3, got 2." in text
    assert not (tmp_path / "o").exists()


def test_p0_sink_layers_past_the_model_is_refused_not_clamped(tmp_path, no_load, monkeypatch,
                                                              gpt2_tiny):
    text = _line(["circuit", "p0_sink", "random:gpt2-tiny", "--layers", "99", "--out",
                  str(tmp_path / "o")])
    assert "p0_sink --layers 99 is more than the model's 2 layers (random:gpt2-tiny): give " \
           "--layers 2 or fewer." in text
    assert not (tmp_path / "o").exists()
    from mechsink.experiments import p0_sink

    with pytest.raises(BadInputError, match="--layers 3 is more than the model's 2 layers"):
        p0_sink.run(gpt2_tiny, n=1, seq_len=8, layers=3)  # the library, once loaded


# --- 11: messages that say what to do on the command line ----------------------------------------


DISCOVER = ["discover", "random:gpt2-tiny", "--metric", "sink_score:1"]


def test_discover_positions_message_speaks_of_positions(tmp_path, no_load):
    text = _line([*DISCOVER, "--positions", "-1", "--out", str(tmp_path / "d")])
    assert "--positions: position numbers start at 0, got '-1'." in text
    assert "layer" not in text
    assert "position numbers such as 0,2,5" in _line([*DISCOVER, "--positions", "x", "--out",
                                                      str(tmp_path / "d")])
    assert not (tmp_path / "d").exists()


def test_discover_bare_logit_diff_under_an_ablation_is_refused_before_loading(tmp_path,
                                                                             no_load):
    """With no --corrupted prompts there is no corrupted prediction for a bare logit_diff:
    refused before the model loads (it loaded and ran forwards first)."""
    text = _line(["discover", "random:gpt2-tiny", "--metric", "logit_diff", "--out",
                  str(tmp_path / "d")])
    assert "metric 'logit_diff' without token ids needs the clean and corrupted prompts" in text
    assert not (tmp_path / "d").exists()


def test_discover_prompts_of_different_lengths_name_the_cli_options(tmp_path, no_load):
    a, b = _gpt2_lengths("The cat sat", "The big dog sat down")
    text = _line([*DISCOVER, "--clean", "The cat sat", "--clean", "The big dog sat down",
                  "--out", str(tmp_path / "d")])
    assert f"(--clean 1: {a}, --clean 2: {b} tokens)" in text
    assert "give --clean prompts of the same number of tokens" in text
    assert "seq_len" not in text
    text = _line([*DISCOVER, "--clean", "The cat sat", "--corrupted", "The big dog sat down",
                  "--out", str(tmp_path / "d")])
    assert "give --clean and --corrupted prompts of the same number of tokens" in text
    assert not (tmp_path / "d").exists()


def test_patch_prompts_of_different_lengths_before_loading(tmp_path, no_load):
    a, b = _gpt2_lengths("The cat sat", "The big dog sat down")
    text = _line(["patch", "random:gpt2-tiny", "--clean", "The cat sat", "--corrupted",
                  "The big dog sat down", "--out", str(tmp_path / "p")])
    assert f"(--clean: {a}, --corrupted: {b} tokens)" in text
    assert not (tmp_path / "p").exists()


def test_circuit_work_dir_is_not_an_option(tmp_path, no_training):
    text = _line(["circuit", "headwise_rmsnorm", "--work-dir", str(tmp_path / "w"), "--out",
                  str(tmp_path / "o")])
    assert "headwise_rmsnorm has no option --work-dir: it writes its runs under --out" in text
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()
    listed = CliRunner().invoke(app, ["circuit", "headwise_rmsnorm", "--help"]).output
    assert "--work-dir" not in listed and "--steps" in listed


@pytest.mark.parametrize("name", ["seedprint", "headwise_rmsnorm", "sink_free", "atlas"])
def test_sweep_experiment_job_that_needs_a_work_folder_is_refused(tmp_path, no_training, name):
    message = _spec_error(tmp_path, f'jobs = ["experiment"]\n[experiment]\nname = "{name}"\n')
    assert f"line 4: experiment {name} writes its own runs into a work folder" in message
    assert ("atlas job" if name == "atlas" else f"mechsink experiment {name} --out DIR") in message


def test_sweep_sink_timeline_run_dir_is_taken_from_the_spec_folder(tmp_path, no_load):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "spec.toml").write_text(
        'jobs = ["experiment"]\n[experiment]\nname = "sink_timeline"\n'
        '[experiment.settings]\nrun_dir = "../run"\nn = 2\n')
    with pytest.raises(BadInputError, match=r"line 5: .*sink_timeline --run-dir .*run does not "
                                            "exist"):
        load_spec(tmp_path / "specs" / "spec.toml")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    spec = load_spec(tmp_path / "specs" / "spec.toml")
    given = Path(spec.settings["experiment"]["settings"]["run_dir"])
    assert given.resolve() == (tmp_path / "run").resolve()


def _closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sweep_ray_address_where_nothing_answers_is_one_line_at_once(tmp_path, no_load):
    (tmp_path / "spec.toml").write_text('models = ["random:gpt2-tiny"]\njobs = ["census"]\n')
    port = _closed_port()
    start = time.monotonic()
    text = _line(["sweep", str(tmp_path / "spec.toml"), "--out", str(tmp_path / "out"),
                  "--ray-address", f"127.0.0.1:{port}"])
    assert time.monotonic() - start < 60  # Ray itself retried for minutes
    assert f"--ray-address 127.0.0.1:{port}: nothing answers there" in text
    assert "ray start --head" in text
    assert "is not HOST:PORT" in _line(["sweep", str(tmp_path / "spec.toml"), "--out",
                                        str(tmp_path / "out"), "--ray-address", "nowhere"])
    assert not (tmp_path / "out").exists()
