"""Folders a user receives are data, never instructions: a planted manifest, a symbolic link
in an output folder or the cache, a hostile token string never make mechsink write, delete or
run anything outside what it was asked to."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mechsink.app.cli import app
from mechsink.errors import BadInputError, MechsinkWarning
from mechsink.io import (
    LOCK_FILE,
    MANIFEST,
    IncompleteResultError,
    check_result_set,
    folder_lock,
    result_set,
)

PATCH = ["patch", "random:gpt2-tiny", "--clean", "The cat sat on the mat", "--corrupted",
         "The dog sat on the mat", "--metric", "sink_score:1", "--device", "cpu"]


def _plant_manifest(out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    files = {name: {"bytes": 1, "sha256": "x"} for name in names}
    (out / MANIFEST).write_text(json.dumps({"format": "mechsink-manifest/1", "files": files}))


# --- 1. a planted manifest -----------------------------------------------------------------------


def test_planted_manifest_cannot_delete_outside_out(tmp_path: Path) -> None:
    """The command of the report: `mechsink patch ... --out o` with o/manifest.json naming
    ../victim.txt and an absolute path; both victims survive, the command succeeds and its
    own manifest replaces the planted one."""
    out = tmp_path / "o"
    victim, absolute = tmp_path / "victim.txt", tmp_path / "elsewhere" / "abs.txt"
    absolute.parent.mkdir()
    victim.write_text("hi\n")
    absolute.write_text("hi\n")
    _plant_manifest(out, ["../victim.txt", str(absolute)])
    with pytest.warns(MechsinkWarning, match="not a file inside"):
        result = CliRunner().invoke(app, [*PATCH, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "hi\n" and absolute.read_text() == "hi\n"
    assert (out / "patch.json").is_file()
    assert set(check_result_set(out, full=True)["files"]) >= {"patch.json"}


def test_manifest_entry_through_a_symlink_out_is_left_alone(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    out = tmp_path / "o"
    out.mkdir()
    (out / "link").symlink_to(outside, target_is_directory=True)
    (out / "own.txt").write_text("old")
    _plant_manifest(out, ["link/keep.txt", "own.txt"])
    with pytest.warns(MechsinkWarning, match="link/keep.txt"), result_set(out) as staging:
        (staging / "new.txt").write_text("new")
    assert (outside / "keep.txt").read_text() == "keep"
    assert not (out / "own.txt").exists()  # a name inside the folder is still cleaned up
    assert set(check_result_set(out)["files"]) == {"new.txt"}


def test_a_link_in_out_is_replaced_not_written_through(tmp_path: Path) -> None:
    """A top-level name of the new result that is a link in --out (to a file or a folder
    elsewhere) is replaced by the result; the link's target is untouched."""
    outside = tmp_path / "outside"
    (outside / "fig").mkdir(parents=True)
    (outside / "a.json").write_text("theirs")
    (outside / "fig" / "b.png").write_text("theirs")
    out = tmp_path / "o"
    out.mkdir()
    (out / "a.json").symlink_to(outside / "a.json")
    (out / "fig").symlink_to(outside / "fig", target_is_directory=True)
    with result_set(out) as staging:
        (staging / "a.json").write_text("mine")
        (staging / "fig").mkdir()
        (staging / "fig" / "b.png").write_text("mine")
    assert (outside / "a.json").read_text() == "theirs"
    assert (outside / "fig" / "b.png").read_text() == "theirs"
    assert not (out / "a.json").is_symlink() and (out / "a.json").read_text() == "mine"
    assert not (out / "fig").is_symlink() and (out / "fig" / "b.png").read_text() == "mine"


def test_check_result_set_refuses_a_manifest_naming_files_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "victim.txt").write_text("x")
    _plant_manifest(tmp_path / "o", ["../victim.txt"])
    with pytest.raises(IncompleteResultError, match="not a file inside"):
        check_result_set(tmp_path / "o")


# --- 3. symbolic links are never followed on write ------------------------------------------------


def test_lock_in_out_that_is_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path
                                                                           ) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "o"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(victim)
    result = CliRunner().invoke(app, [*PATCH, "--out", str(out)])
    assert result.exit_code != 0
    assert "symbolic link" in result.output and "Traceback" not in result.output
    assert victim.read_text() == "precious\n"
    with pytest.raises(BadInputError, match="symbolic link"), folder_lock(out):
        pass
    assert victim.read_text() == "precious\n"


def test_lock_that_is_a_hard_link_to_another_file_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "o").mkdir()
    os.link(victim, tmp_path / "o" / LOCK_FILE)
    with pytest.raises(BadInputError, match="hard link"), folder_lock(tmp_path / "o"):
        pass
    assert victim.read_text() == "precious\n"


def test_a_lock_left_by_a_dead_process_is_still_taken_over(tmp_path: Path) -> None:
    (tmp_path / LOCK_FILE).write_text(json.dumps({"pid": 2**22 + 12345}) + "\n")
    with folder_lock(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()


def test_conversion_lock_that_is_a_symlink_is_refused(tmp_path: Path, monkeypatch) -> None:
    from mechsink.model.zoo.stale import conversion_lock, lock_path

    monkeypatch.setenv("MECHSINK_CACHE", str(tmp_path / "cache"))
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock = lock_path("smollm2-135m")
    lock.parent.mkdir(parents=True)
    lock.symlink_to(victim)
    with pytest.raises(BadInputError, match="symbolic link"), conversion_lock("smollm2-135m"):
        pass
    assert victim.read_text() == "precious\n"


SWEEP = """\
models = ["random:gpt2-tiny"]
jobs = ["census"]

[census]
suites = ["random"]
variants = ["bos"]
n = 1
seq_len = 8
"""


@pytest.mark.parametrize("sub", ["shards", "census"])
def test_sweep_whose_shard_or_job_folder_is_a_symlink_is_refused(tmp_path: Path, sub: str
                                                                  ) -> None:
    from mechsink.app.sweep import run_sweep

    (tmp_path / "spec.toml").write_text(SWEEP)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / sub).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(BadInputError, match="symbolic link") as info:
        run_sweep(tmp_path / "spec.toml", out)
    assert "\n" not in str(info.value)
    assert list(elsewhere.iterdir()) == []
    assert not (out / "summary.json").exists()


# --- 4, 5. the conversion cache proves what it serves --------------------------------------------


CACHED = "fake-pinned"
TOKENS = [[50256, 464, 3139, 286, 4881, 318, 6342]]


class _Source:
    """A zoo source that writes a fixed tiny model and records a pinned 'source hash'."""

    def __init__(self, model, tok, record):
        self.model, self.tok, self._record, self.builds = model, tok, record, 0

    def build(self, folder: Path, name: str) -> None:
        self.builds += 1
        self.model.save_pretrained(folder)
        self.tok.save_pretrained(folder)

    def record(self):
        return self._record


@pytest.fixture()
def cached(tmp_path, monkeypatch):
    """A named zoo entry (random:llama-tiny, seed 3) whose decoded weights are pinned, in a
    temporary cache; returns (source, reference logits, its folder, a function making entries)."""
    import importlib.metadata

    import torch

    from mechsink.model import assets, zoo
    from mechsink.model.zoo import ZooEntry, random_hf_model
    from mechsink.model.zoo.cache import Pinned

    model, tok = random_hf_model("llama-tiny", seed=3)
    with torch.no_grad():
        expected = model(torch.tensor(TOKENS)).logits
    model.save_pretrained(tmp_path / "reference")
    weights_sha = assets.sha256_of(tmp_path / "reference" / "model.safetensors")
    monkeypatch.setenv("MECHSINK_CACHE", str(tmp_path / "cache"))
    version = importlib.metadata.version("transformers")

    def entry(record=("gguf", "abc"), sha=weights_sha):
        source = _Source(model, tok, list(record))
        pinned = Pinned(version, {"model.safetensors": sha}) if sha else None
        monkeypatch.setitem(zoo.NAMED_MODELS, CACHED,
                            ZooEntry(CACHED, "a tiny pinned fake", source, pinned=pinned))
        return source

    return entry, expected, tmp_path / "cache" / "models" / CACHED


def _load_logits():
    import torch

    from mechsink.model.zoo import load_model

    with torch.no_grad():
        return load_model(CACHED, device="cpu")(torch.tensor(TOKENS))


def _flip_byte_keep_mtime(path: Path) -> None:
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(st.st_size - 100)
        byte = f.read(1)
        f.seek(st.st_size - 100)
        f.write(bytes([byte[0] ^ 0x10]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def _rewrite_records(folder: Path) -> None:
    """What someone with write access does after editing a file: record its new hash, size
    and times, so that checksums.json agrees with the files again."""
    from mechsink.model import assets

    data = json.loads((folder / "checksums.json").read_text())
    for rel, rec in data["files"].items():
        st = (folder / rel).stat()
        rec.update(size=st.st_size, sha256=assets.sha256_of(folder / rel),
                   mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns)
    (folder / "checksums.json").write_text(json.dumps(data))


def _row(verify: bool):
    from mechsink.model import zoo

    return next(r for r in zoo.list_models(verify=verify) if r["name"] == CACHED)


def test_rewritten_weights_with_rewritten_checksums_fail_the_pins(cached, capfd) -> None:
    import torch

    entry, expected, folder = cached
    source = entry()
    _load_logits()
    assert json.loads((folder / "mechsink.json").read_text())["pinned"] is True
    assert _row(True)["proof"] == "pinned hashes"
    _flip_byte_keep_mtime(folder / "model.safetensors")
    _rewrite_records(folder)
    row = _row(True)
    assert not row["cached"] and "pinned" in row["problem"]
    capfd.readouterr()
    torch.testing.assert_close(_load_logits(), expected, rtol=0, atol=1e-5)
    assert source.builds == 2 and "rebuilding" in capfd.readouterr().err
    assert _row(True)["cached"]


def test_verify_says_what_it_proves(cached) -> None:
    entry, _, _ = cached
    entry()
    _load_logits()
    result = CliRunner().invoke(app, ["models", "--verify"])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert f"{CACHED}: checked against pinned hashes" in flat
    assert "does not defend against someone who can write to the cache" in flat


def test_a_conversion_from_another_source_is_rebuilt(cached) -> None:
    entry, _, folder = cached
    entry(record=("gguf", "old"))
    _load_logits()
    source = entry(record=("gguf", "new"))  # the zoo entry now pins another source
    _load_logits()
    assert source.builds == 1
    assert json.loads((folder / "mechsink.json").read_text())["source"] == ["gguf", "new"]


def test_a_conversion_older_than_the_source_record_is_kept_when_it_matches_the_pins(
        cached) -> None:
    entry, _, folder = cached
    source = entry()
    _load_logits()
    marker = json.loads((folder / "mechsink.json").read_text())
    del marker["source"], marker["pinned"]
    (folder / "mechsink.json").write_text(json.dumps(marker))
    _rewrite_records(folder)  # as an older mechsink wrote it
    _load_logits()
    assert source.builds == 1  # proven by the pins: not converted again
    assert json.loads((folder / "mechsink.json").read_text())["source"] == ["gguf", "abc"]
    entry(sha=None)  # without pins the same folder is rebuilt
    marker = json.loads((folder / "mechsink.json").read_text())
    del marker["source"]
    (folder / "mechsink.json").write_text(json.dumps(marker))
    _rewrite_records(folder)
    before = (folder / "mechsink.json").read_text()
    _load_logits()
    assert (folder / "mechsink.json").read_text() != before


def test_a_conversion_that_does_not_reproduce_the_pins_is_used_once_built(cached, capfd) -> None:
    entry, expected, _ = cached
    source = entry(sha="0" * 64)
    _load_logits()
    assert "checked against their own record only" in capfd.readouterr().err
    _load_logits()
    assert source.builds == 1  # no rebuild on every load
    assert _row(True)["proof"] == "own record (this conversion did not reproduce the pins)"


def test_flipped_byte_with_restored_mtime_is_rebuilt_on_the_next_load(cached, capfd) -> None:
    """The report's case 5a: the file's change time moves even when its modification time is
    put back, so the cheap check hashes it."""
    import torch

    entry, expected, folder = cached
    source = entry(sha=None)
    _load_logits()
    _flip_byte_keep_mtime(folder / "model.safetensors")
    capfd.readouterr()
    torch.testing.assert_close(_load_logits(), expected, rtol=0, atol=1e-5)
    assert source.builds == 2 and "sha256" in capfd.readouterr().err


def test_damage_found_by_verify_is_rebuilt_on_the_next_load(cached, capfd) -> None:
    """The report's case 5b: damage the cheap check cannot see (here: its records of the times
    brought up to date, as damage on the disk itself would leave them), found by `--verify`,
    is not served by the next load."""
    import torch

    entry, expected, folder = cached
    source = entry(sha=None)
    _load_logits()
    _flip_byte_keep_mtime(folder / "model.safetensors")
    data = json.loads((folder / "checksums.json").read_text())
    st = (folder / "model.safetensors").stat()
    data["files"]["model.safetensors"]["ctime_ns"] = st.st_ctime_ns
    (folder / "checksums.json").write_text(json.dumps(data))
    assert _row(False)["cached"]  # invisible to the cheap check
    result = CliRunner().invoke(app, ["models", "--verify"])
    assert result.exit_code == 1 and f"damaged conversions: {CACHED}" in result.output
    capfd.readouterr()
    torch.testing.assert_close(_load_logits(), expected, rtol=0, atol=1e-5)
    assert source.builds == 2 and "sha256" in capfd.readouterr().err
    assert _row(True)["cached"]


# --- 2. token strings and names never become markup or script -------------------------------------

HOSTILE = "</script><script>document.title='PWNED'</script>"


@pytest.fixture(scope="module")
def hostile_model(tmp_path_factory) -> Path:
    """A tiny random GPT-2 whose every ordinary token is a script tag (the organism word-level
    tokenizer with its 64 words replaced), saved as a folder to load through ``hf:``."""
    import shutil

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("hostile")
    tok_dir = Path(__file__).resolve().parents[1] / "mechsink" / "organisms" / "bb-gpt2-tiny"
    shutil.copy(tok_dir / "tokenizer_config.json", folder)
    tok = json.loads((tok_dir / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    tok["model"]["vocab"] = {(HOSTILE.replace("PWNED", f"PWNED{i}") if i < 64 else word): i
                             for word, i in vocab.items()}
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=65, n_positions=64,
                        bos_token_id=64, eos_token_id=64)
    GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def _no_live_script(page: str, n_scripts: int) -> None:
    """``page`` holds the ``n_scripts`` script elements mechsink writes, as an HTML parser
    reads it (script content runs to the first ``</script``): no token string opened one."""
    from html.parser import HTMLParser

    class Scripts(HTMLParser):
        found = 0

        def handle_starttag(self, tag, attrs):
            self.found += tag == "script"

    parser = Scripts()
    parser.feed(page)
    parser.close()
    assert parser.found == n_scripts
    assert "<script>document.title" not in page


def test_scan_report_embeds_hostile_tokens_as_data(hostile_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "scan"
    result = CliRunner().invoke(app, [
        "scan", f"hf:{hostile_model}", "--out", str(out), "--suite", "random", "--variant",
        "bos", "--n", "2", "--seq-len", "8", "--no-validate-sets", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    page = (out / "attention.html").read_text()
    assert "document.title='PWNED" in page  # the tokens are there, as data
    assert "\\u003c/script\\u003e\\u003cscript\\u003edocument.title='PWNED" in page
    _no_live_script(page, 2)
    _no_live_script((out / "index.html").read_text(), 0)
    from mechsink.viz.attention import circuitsvis_js

    lib = circuitsvis_js()  # the one library script mechsink inlines, itself closed only once
    assert "</script" not in lib.lower()


def test_every_html_writer_escapes_what_it_embeds(tmp_path: Path) -> None:
    import torch

    from mechsink.viz import attention
    from mechsink.viz.circuit_html import circuit_page
    from mechsink.viz.gallery import attention_block
    from mechsink.viz.html_safe import script_json

    tokens = [HOSTILE, "a&b", "<!--"]
    view = attention(torch.full((1, 3, 3), 1 / 3), tokens, title=HOSTILE)
    attention.reset_js()
    for page in (view.html(), view._repr_html_()):
        _no_live_script(page, 2)
        assert "<!--" not in page
    head = {"layer": 0, "head": 1, "sink_score": 0.5, "pattern": [[1.0], [0.5, 0.5],
                                                                  [0.3, 0.3, 0.4]]}
    block = attention_block('x"><script>alert(1)</script>', tokens, [head], title=HOSTILE)
    _no_live_script(block, 2)
    assert '"><script>' not in block
    graph = {"n_heads": 2, "n_kv_heads": 2, "n_layers": 1}
    circuit = {"graph": graph, "n_edges": 1, "how": HOSTILE,
               "edges": [{"sender": "embed", "receiver": "L0H1.q", "score": 0.5}]}
    _no_live_script(circuit_page(circuit, tmp_path / "c.html").read_text(), 1)
    # the JSON reads back as the same value, in JSON and in JavaScript string syntax
    assert json.loads(script_json(tokens)) == tokens
    assert not {"<", ">", "&"} & set(script_json(tokens))
