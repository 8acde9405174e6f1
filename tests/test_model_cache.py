"""The verified conversion cache: checksums written with every converted file, checked on load,
damaged or partial conversions rebuilt from the source by themselves (on a tiny fake entry)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mechsink.model import zoo
from mechsink.model.zoo import ZooEntry, conversion_problem, load_model, random_hf_model

NAME = "fake-tiny"
TOKENS = torch.tensor([[50256, 464, 3139, 286, 4881, 318, 6342]])


@pytest.fixture()
def fake(tmp_path, monkeypatch):
    """A named zoo entry whose 'source' is random:llama-tiny, seed 3, built into a temp cache."""
    model, tok = random_hf_model("llama-tiny", seed=3)  # tokenizer from the real cache
    with torch.no_grad():
        expected = model(TOKENS).logits
    builds: list[Path] = []

    def build(folder: Path) -> None:
        builds.append(folder)
        model.save_pretrained(folder)
        tok.save_pretrained(folder)

    monkeypatch.setenv("MECHSINK_CACHE", str(tmp_path / "cache"))
    source = SimpleNamespace(build=lambda folder, name: build(folder))
    monkeypatch.setitem(zoo.NAMED_MODELS, NAME, ZooEntry(NAME, "a tiny fake", source))
    return builds, expected, tmp_path / "cache" / "models" / NAME


def _logits(name: str = NAME) -> torch.Tensor:
    with torch.no_grad():
        return load_model(name, device="cpu")(TOKENS)


def _keep_mtime(path: Path, edit) -> None:
    st = path.stat()
    edit(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_conversion_records_size_and_sha256_of_every_file(fake):
    builds, expected, folder = fake
    torch.testing.assert_close(_logits(), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(_logits(), expected, rtol=0, atol=1e-5)
    assert len(builds) == 1  # the second load used the cache
    files = json.loads((folder / "checksums.json").read_text())["files"]
    on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                     if p.is_file() and p.name != "checksums.json")
    assert sorted(files) == on_disk and "model.safetensors" in files
    import hashlib

    for rel, rec in files.items():
        data = (folder / rel).read_bytes()
        assert rec["size"] == len(data) and rec["sha256"] == hashlib.sha256(data).hexdigest()


def _ff_in_middle(path: Path) -> None:
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"\xff" * 4096)


def _flip_200_bits(path: Path) -> None:
    data = bytearray(path.read_bytes())
    gen = torch.Generator().manual_seed(0)
    start = 1000  # past the header
    for i in torch.randint(start, len(data), (200,), generator=gen).tolist():
        data[i] ^= 1 << (i % 8)
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 4096)


def _break_header(path: Path) -> None:
    with open(path, "r+b") as f:
        f.write(b"\xff" * 8)  # the safetensors header length


@pytest.mark.parametrize("damage, keep_mtime", [
    (_ff_in_middle, False),  # same size, new time: the cheap check hashes it
    (_flip_200_bits, False),
    (_truncate, False),  # size differs
    (_break_header, True),  # same size and time: caught by the load error, then a full hash
    (lambda p: p.unlink(), False),  # a deleted weights file
], ids=["4KiB-0xFF", "200-bits", "truncated", "broken-header", "deleted"])
def test_damaged_conversion_is_rebuilt_saying_so(fake, capfd, damage, keep_mtime):
    builds, expected, folder = fake
    _logits()
    weights = folder / "model.safetensors"
    if keep_mtime:
        _keep_mtime(weights, damage)
    else:
        damage(weights)
    capfd.readouterr()
    out = _logits()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)
    assert len(builds) == 2
    err = capfd.readouterr().err
    assert "damaged" in err and "rebuilding" in err and "model.safetensors" in err
    assert conversion_problem(folder, full=True) is None


def test_partial_conversion_without_marker_or_checksums_is_rebuilt(fake, capfd):
    builds, expected, folder = fake
    _logits()
    (folder / "checksums.json").unlink()  # e.g. written by an older mechsink
    torch.testing.assert_close(_logits(), expected, rtol=0, atol=1e-5)
    (folder / "mechsink.json").unlink()
    torch.testing.assert_close(_logits(), expected, rtol=0, atol=1e-5)
    assert len(builds) == 3
    assert "checksums.json is missing" in capfd.readouterr().err


def test_copied_cache_with_new_times_is_hashed_once_and_kept(fake):
    builds, _, folder = fake
    _logits()
    for p in folder.rglob("*"):
        if p.is_file() and p.name != "checksums.json":
            os.utime(p, ns=(1, 1))  # as `cp -r` without -p would leave it: new times, same bytes
    assert conversion_problem(folder) is None  # hashed, found whole, times recorded
    files = json.loads((folder / "checksums.json").read_text())["files"]
    assert {rec["mtime_ns"] for rec in files.values()} == {1}
    _logits()
    assert len(builds) == 1


def test_models_does_not_list_a_broken_conversion_as_cached(fake):
    _, _, folder = fake
    _logits()
    row = next(r for r in zoo.list_models() if r["name"] == NAME)
    assert row["cached"] and row["problem"] is None
    _keep_mtime(folder / "model.safetensors", _ff_in_middle)  # its change time still moves
    row = next(r for r in zoo.list_models() if r["name"] == NAME)
    assert not row["cached"] and "sha256" in row["problem"]
    row = next(r for r in zoo.list_models(verify=True) if r["name"] == NAME)
    assert not row["cached"] and "sha256" in row["problem"]
    _truncate(folder / "model.safetensors")
    row = next(r for r in zoo.list_models() if r["name"] == NAME)
    assert not row["cached"] and "bytes" in row["problem"]


def test_models_verify_command(fake):
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    _, _, folder = fake
    _logits()
    ok = CliRunner().invoke(app, ["models", "--verify"])
    assert ok.exit_code == 0, ok.output
    _keep_mtime(folder / "model.safetensors", _ff_in_middle)
    bad = CliRunner().invoke(app, ["models", "--verify"])
    assert bad.exit_code == 1 and "sha256" in bad.output and NAME in bad.output


# --- a GGUF split over packages, joined in order and checked ---------------------------------


def _packaged_parts(tmp_path, monkeypatch, chunks):
    """Assets whose files already sit in a temporary cache (as fetched), pinned by hashlib."""
    import hashlib

    from mechsink.model import assets
    from mechsink.model.assets import Asset

    monkeypatch.setenv("MECHSINK_CACHE", str(tmp_path / "cache"))
    parts = []
    for i, chunk in enumerate(chunks):
        asset = Asset(f"fake-gguf-part{i + 1}", "1.0.0", f"fake_gguf_part{i + 1}/data/part{i}",
                      hashlib.sha256(chunk).hexdigest())
        path = assets.cached_path(asset)
        path.parent.mkdir(parents=True)
        path.write_bytes(chunk)
        parts.append(asset)
    return tuple(parts)


def test_a_gguf_in_parts_is_joined_in_order_and_replaces_them(tmp_path, monkeypatch):
    import hashlib

    from mechsink.model import assets
    from mechsink.model.zoo import GGUF

    chunks = [b"GGUF" + bytes(range(200)), b"\x01" * 3000, b"tail"]
    parts = _packaged_parts(tmp_path, monkeypatch, chunks)
    whole = b"".join(chunks)
    source = GGUF(parts, joined="fake.gguf", joined_sha256=hashlib.sha256(whole).hexdigest())
    path = source.fetch("fake-model")
    assert path == tmp_path / "cache" / "assets" / "fake-model" / "fake.gguf"
    assert path.read_bytes() == whole
    assert not any(assets.cached_path(p).exists() for p in parts)  # the join replaced them
    assert source.fetch("fake-model") == path  # found again by its hash, nothing refetched


def test_a_joined_gguf_that_misses_its_published_hash_is_refused(tmp_path, monkeypatch):
    from mechsink.errors import MechsinkError
    from mechsink.model.zoo import GGUF

    parts = _packaged_parts(tmp_path, monkeypatch, [b"GGUF-a", b"b"])
    source = GGUF(parts, joined="fake.gguf", joined_sha256="0" * 64)
    with pytest.raises(MechsinkError, match="published sha256"):
        source.fetch("fake-model")
    assert not (tmp_path / "cache" / "assets" / "fake-model" / "fake.gguf").exists()


def test_a_gguf_in_parts_needs_the_joined_name_and_hash():
    from mechsink.model.assets import Asset
    from mechsink.model.zoo import GGUF

    part = Asset("p", "1", "p/x", "0" * 64)
    with pytest.raises(ValueError, match="joined"):
        GGUF((part, part))


def test_a_new_entry_is_listed_named_and_loaded(fake):
    """Adding a zoo model is one entry: load_model, list_models, known_names and the unknown-name
    error all see it."""
    from mechsink.errors import UnknownModelError

    _, expected, _ = fake
    torch.testing.assert_close(_logits(), expected, rtol=0, atol=1e-5)
    assert NAME in zoo.known_names()
    assert [r["description"] for r in zoo.list_models() if r["name"] == NAME] == ["a tiny fake"]
    with pytest.raises(UnknownModelError, match=NAME):
        load_model("fake-tiny-2")


# --- leftovers of killed conversions (#29 item 6) --------------------------------------------


def _dead_pid() -> int:
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _leftover(folder: Path, pid: int) -> tuple[Path, Path]:
    """What a conversion killed mid-way leaves: its temporary folder, a temporary joined GGUF
    and the lock file naming its (now dead) process, whose flock went with it."""
    from mechsink.model.zoo.stale import lock_path

    part = folder.parent / f".{NAME}.k1ll3d_x.part"
    part.mkdir(parents=True)
    (part / "model.safetensors").write_bytes(b"\0" * 3000)
    joined = folder.parent.parent / "assets" / NAME / f".{NAME}.gguf.ab12cd34.part"
    joined.parent.mkdir(parents=True)
    joined.write_bytes(b"\0" * 500)
    lock_path(NAME).write_text(json.dumps({"pid": pid}))
    return part, joined


def test_a_killed_conversions_leftovers_are_listed_then_removed_on_the_next_load(fake, capfd):
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    builds, expected, folder = fake
    _logits()
    part, joined = _leftover(folder, _dead_pid())
    other = folder.parent / ".fake-tiny-2.abcdefgh.part"  # another model's name: not ours
    other.mkdir()
    row = next(r for r in zoo.list_models() if r["name"] == NAME)
    assert row["stale"] == [{"path": str(joined), "bytes": 500}, {"path": str(part), "bytes": 3000}]
    listed = CliRunner().invoke(app, ["models", "--verify"])
    assert listed.exit_code == 0, listed.output
    assert "stale:" in listed.output and str(part) in "".join(listed.output.split())
    capfd.readouterr()
    torch.testing.assert_close(_logits(), expected, rtol=0, atol=1e-5)
    assert not part.exists() and not joined.exists() and other.exists()
    assert "removed 2 leftover(s) of a killed fake-tiny conversion" in capfd.readouterr().err
    assert next(r for r in zoo.list_models() if r["name"] == NAME)["stale"] == []
    assert len(builds) == 1 and folder.is_dir()  # the good conversion was kept


def test_a_running_conversions_files_are_not_leftovers(fake):
    import fcntl

    from mechsink.model.zoo.stale import leftovers, lock_path

    _, expected, folder = fake
    _logits()
    part, _ = _leftover(folder, os.getpid())
    fd = os.open(lock_path(NAME), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a live converter holds the lock
    try:
        assert leftovers(NAME) == []
        assert next(r for r in zoo.list_models() if r["name"] == NAME)["stale"] == []
        torch.testing.assert_close(_logits(), expected, rtol=0, atol=1e-5)
        assert part.is_dir()  # not touched while its conversion may still be writing
    finally:
        os.close(fd)
    assert [left.path for left in leftovers(NAME)][-1] == part


def test_a_conversion_holds_its_lock_and_a_second_waits(fake):
    import threading

    from mechsink.model.zoo.stale import conversion_lock, lock_is_held

    builds, expected, folder = fake
    order: list[str] = []
    with conversion_lock(NAME):
        assert lock_is_held(NAME)
        worker = threading.Thread(target=lambda: order.append(str(_logits().shape)))
        worker.start()
        worker.join(timeout=1.0)
        assert worker.is_alive() and not builds  # waiting for the lock, nothing built
        order.append("released")
    worker.join(timeout=60)
    assert order[0] == "released" and len(builds) == 1 and not lock_is_held(NAME)
