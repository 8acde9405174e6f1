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


# --- one-line errors before any work -------------------------------------------------------


def test_census_with_a_string_for_suites_is_an_error(gpt2_tiny):
    from mechsink.measure.census import census

    with pytest.raises(BadInputError, match=r"not the string 'natural'.*\['natural'\]"):
        census(gpt2_tiny, "natural", n=1, seq_len=4)
    with pytest.raises(BadInputError, match="variants takes a list"):
        census(gpt2_tiny, ["natural"], "bos", n=1, seq_len=4)


def test_read_census_on_a_missing_file_or_bad_json(tmp_path: Path) -> None:
    from mechsink.measure.census import read_census

    with pytest.raises(BadInputError, match="does not exist"):
        read_census(tmp_path / "nope.json")
    with pytest.raises(BadInputError, match="does not exist"):
        read_census(tmp_path)  # a folder without census.json
    (tmp_path / "census.json").write_text('{"schema": "mechsink-census/1", "runs": [')
    with pytest.raises(BadInputError, match="not valid JSON"):
        read_census(tmp_path)
    (tmp_path / "census.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(BadInputError, match="not valid JSON"):
        read_census(tmp_path / "census.json")
    (tmp_path / "census.json").write_text("[1, 2]")
    with pytest.raises(BadInputError, match="holds no census"):
        read_census(tmp_path)


# --- the command line: every check before the model loads ----------------------------------


@pytest.fixture()
def no_load(monkeypatch):
    """Fail the test if a command loads a model (bad input must stop before that)."""
    from mechsink.model import zoo

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(zoo, "load_model", refuse)


def _invoke(args: list[str]):
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    return CliRunner().invoke(app, args)


def _one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # no traceback
    text = " ".join(result.output.split())
    assert text.startswith("error:") and "Traceback" not in text, text
    for needle in needles:
        assert needle in text, text


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a CPU-only torch")
def test_info_on_cuda_without_cuda(no_load):
    _one_line_error(_invoke(["info", "random:gpt2-tiny", "--device", "cuda"]),
                    "no CUDA device", "--device cpu")


@pytest.mark.parametrize("args, needles", [
    (["--out", "/proc/mechsink-x"], ["/proc/mechsink-x cannot be written"]),
    (["--out", ""], ["--out is empty"]),
    (["--out", "{tmp}/d", "--batch-size", "0"], ["--batch-size", "got 0"]),
    (["--out", "{tmp}/d", "--seq-len", "999"], ["--seq-len 999", "context (random:gpt2-tiny: 256"]),
    (["--out", "{tmp}/d", "--device", "cuda:7"], ["cuda:7"]),
], ids=["proc", "empty", "batch-size", "seq-len", "device"])
def test_scan_checks_before_loading(tmp_path, no_load, args, needles):
    import torch

    if "cuda:7" in args and torch.cuda.device_count() > 7:
        pytest.skip("has 8 GPUs")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    _one_line_error(_invoke(["scan", "random:gpt2-tiny", "--n", "2", *args]), *needles)
    assert not (Path.cwd() / "census.json").exists() or args[1] != ""


def test_scan_of_an_unknown_model_fails_before_touching_out(tmp_path, no_load):
    result = _invoke(["scan", "random:gpt2-huge", "--out", str(tmp_path / "d"), "--n", "2"])
    _one_line_error(result, "unknown size 'huge'")


PATCH = ["patch", "random:gpt2-tiny", "--clean", "When Mary and John went", "--corrupted",
         "When Mary and Anna went"]


@pytest.mark.parametrize("args, needles", [
    (["--layers", "a,b"], ["--layers", "'a,b'"]),
    (["--layers", "0,-1"], ["--layers"]),
    (["--site", "nosuch"], ["nosuch"]),
    (["--metric", "bogus:1"], ["bogus"]),
    (["--metric", "sink_score:x"], ["integers"]),
    (["--direction", "sideways"], ["--direction", "sideways"]),
], ids=["layers", "negative-layer", "site", "metric", "metric-args", "direction"])
def test_patch_checks_every_option_before_loading(tmp_path, no_load, args, needles):
    _one_line_error(_invoke([*PATCH, "--out", str(tmp_path / "p"), *args]), *needles)


def test_patch_out_an_existing_file_fails_before_the_sweep(tmp_path, no_load):
    f = tmp_path / "f"
    f.write_text("keep me")
    _one_line_error(_invoke([*PATCH, "--out", str(f)]), "is a file")
    assert f.read_text() == "keep me"
    _one_line_error(_invoke([*PATCH, "--out", ""]), "--out is empty")


def test_train_out_empty_and_nothing_to_resume(tmp_path):
    _one_line_error(_invoke(["train", "bb-llama-tiny", "--out", ""]), "--out is empty")
    _one_line_error(_invoke(["train", "bb-llama-tiny", "--out", str(tmp_path / "r"),
                             "--resume"]), "nothing to resume")


@pytest.mark.parametrize("command", [
    ["scan", "random:gpt2-tiny", "--n", "2", "--seq-len", "8"],
    PATCH,
    ["train", "bb-llama-tiny", "--steps", "1"],
], ids=["scan", "patch", "train"])
def test_a_second_writer_is_refused_naming_the_first(tmp_path, no_load, command):
    proc = _start_holder(tmp_path)
    try:
        result = _invoke([*command, "--out", str(tmp_path)])
        _one_line_error(result, f"process {proc.pid}", "holder-cmd --seed 0")
    finally:
        proc.kill()
        proc.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_FILE]  # nothing written


def test_organism_with_a_broken_marker_or_no_config(tmp_path, gpt2_tiny):
    from mechsink.errors import MechsinkError
    from mechsink.model.zoo import load_model, save_organism

    folder = save_organism(gpt2_tiny, tmp_path / "org")
    marker = folder / "mechsink.json"
    good = marker.read_text()
    marker.write_text("{not json")
    with pytest.raises(MechsinkError, match="not valid JSON"):
        load_model(f"organism:{folder}", device="cpu")
    _one_line_error(_invoke(["info", f"organism:{folder}", "--device", "cpu"]), "not valid JSON")
    marker.write_text(good)
    (folder / "config.json").unlink()
    with pytest.raises(MechsinkError, match="has no config.json"):
        load_model(f"organism:{folder}", device="cpu")
    (folder / "config.json").write_text("{")
    with pytest.raises(MechsinkError, match="cannot be read as a transformers config"):
        load_model(f"organism:{folder}", device="cpu")


def test_scan_progress_bar_ends_at_n_when_n_is_not_a_multiple_of_the_batch(tmp_path,
                                                                            monkeypatch):
    from rich.progress import Progress

    seen: list[float] = []
    real_update = Progress.update

    def update(self, task_id, **kwargs):
        real_update(self, task_id, **kwargs)
        seen.append(self._tasks[task_id].completed)

    monkeypatch.setattr(Progress, "update", update)
    result = _invoke(["scan", "random:gpt2-tiny", "--out", str(tmp_path), "--n", "5",
                      "--batch-size", "2", "--seq-len", "8", "--suite", "natural",
                      "--suite", "random", "--variant", "bos", "--no-report"])
    assert result.exit_code == 0, result.output
    assert seen == [2, 4, 5, 7, 9, 10]  # per run 2, 4, 5 of 5; two runs


# --- same seed, same census ----------------------------------------------------------------

_CENSUS = textwrap.dedent("""
    import sys, torch
    torch.set_num_threads(int(sys.argv[1]))
    from mechsink import load_model
    from mechsink.measure.census import census, census_json
    m = load_model("random:llama-tiny", device="cpu", seed=0)
    def once():
        return census_json(census(m, ["natural", "random"], ["bos", "randfirst"], n=5,
                                  seq_len=24, batch_size=2, seed=3,
                                  model_name="random:llama-tiny"))
    first = once()
    junk = [torch.empty(i * 1031) for i in range(1, 50)]  # move the allocator between repeats
    assert once() == first, "two censuses in one process differ"
    sys.stdout.write(first)
""")


def _census_text(threads: int, hash_seed: int) -> str:
    env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
    proc = subprocess.run([sys.executable, "-c", _CENSUS, str(threads)], capture_output=True,
                          text=True, env=env, timeout=600, check=True)
    return proc.stdout


def _close(a, b, path: str = "") -> list[str]:
    """Where two census values differ beyond the documented tolerance (relative 1e-5, the
    last of the six rounded significant digits; absolute 1e-6 near zero)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a.keys() ^ b.keys())}"]
        return [d for k in a for d in _close(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: lengths {len(a)} != {len(b)}"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in _close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float | int) and not isinstance(b, bool):
        return [] if abs(a - b) <= 1e-5 * max(abs(a), abs(b)) + 1e-6 else [f"{path}: {a} {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_census_repeats_exactly_and_agrees_within_tolerance_across_thread_counts():
    """Each subprocess checks two censuses of its own are byte-identical; across torch thread
    counts 1 and 2 (and hash seeds) they agree within the tolerance docs/census-schema.md states
    (on the machines measured so far they were byte-identical too)."""
    one_a, two = _census_text(1, 1), _census_text(2, 2)
    assert _close(json.loads(one_a), json.loads(two)) == []
    assert json.loads(one_a)["runs"][0]["sink_score"]  # a real census, not an empty one
    # A perturbation at the 5th significant digit is caught by the comparison itself.
    data = json.loads(one_a)
    data["runs"][0]["sink_score"][0][0] *= 1.0001
    assert _close(json.loads(one_a), data) != []


def test_damaged_token_cache_is_rebuilt(tmp_path, monkeypatch, capfd):
    from types import SimpleNamespace

    import numpy as np

    from mechsink.inputs import corpus, tasks
    from mechsink.model import assets, zoo

    tok = zoo.gpt2_tokenizer()  # the real one, before the cache moves
    docs = (SimpleNamespace(text="Attention sinks"), SimpleNamespace(text="form early."))
    monkeypatch.setattr(assets, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(zoo, "gpt2_tokenizer", lambda: tok)
    monkeypatch.setattr(corpus, "natural_documents", lambda: docs)
    path = tmp_path / "data" / "natural-gpt2-tokens.npy"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x93NUMPY garbage")  # a damaged cache file
    tasks._text_tokens.cache_clear()
    try:
        rebuilt = tasks._text_tokens()
    finally:
        tasks._text_tokens.cache_clear()
    expected = [i for d in docs for i in tok(d.text)["input_ids"] + [50256]]
    assert "damaged" in capfd.readouterr().err
    assert rebuilt.tolist() == expected and np.load(path).tolist() == expected


# --- messages (#29 item 18): warnings in one line, attributed outside mechsink ---------------


def test_the_cli_shows_a_warning_in_one_line_without_mechsinks_source(tmp_path):
    import subprocess
    import sys

    code = "import sys; sys.argv[0] = 'mechsink'\nfrom mechsink.app.cli import app\napp()"
    done = subprocess.run(
        [sys.executable, "-c", code, "patch", "random:gpt2-tiny", "--clean",
         "The cat sat on the mat", "--corrupted", "The dog sat on the mat", "--metric", "kl",
         "--device", "cpu", "--out", str(tmp_path / "p")],
        capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                          "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert [ln for ln in lines if ln.startswith("warning: the metric 'kl_to_clean'")], lines
    assert not [ln for ln in lines if "warnings.warn" in ln or "mechsink/" in ln], lines


def test_errors_warn_names_the_first_line_outside_mechsink():
    from mechsink.errors import MechsinkWarning, warn

    with pytest.warns(MechsinkWarning, match="from a user") as seen:
        warn("from a user")
    assert seen[0].filename == __file__


def test_scan_with_n_1_gives_no_numpy_warning(tmp_path):
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = _invoke(["scan", "random:gpt2-tiny", "--out", str(tmp_path), "--n", "1",
                          "--seq-len", "8", "--no-report"])
    assert result.exit_code == 0, result.output
    assert [str(w.message) for w in seen if issubclass(w.category, RuntimeWarning)] == []
