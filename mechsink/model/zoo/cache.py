"""The verified conversion cache: folders the zoo builds once, checked on every load.

A converted folder (``<cache>/models/<name>/``) holds the model's files, ``mechsink.json`` (what
it is) and ``checksums.json`` (size, sha256 and modification time of every file, written with
them). Each load checks the folder cheaply (present, sizes, modification times; a file whose
time changed is hashed in full) and any load error triggers a full hash; a damaged, partial or
missing conversion is rebuilt from its verified source, saying so on stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mechsink.io import atomic_dir, atomic_write_json
from mechsink.model import assets

MARKER = "mechsink.json"
CHECKSUMS = "checksums.json"
CHECKSUM_FORMAT = "mechsink-checksums/1"


def models_dir() -> Path:
    """Where converted folders live (``<cache>/models``)."""
    return assets.cache_dir() / "models"


def converted_dir(name: str) -> Path:
    """The converted folder of the zoo model ``name`` (whether or not it exists yet)."""
    return models_dir() / name


def _file_record(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"size": st.st_size, "sha256": assets.sha256_of(path), "mtime_ns": st.st_mtime_ns}


def write_conversion(folder: Path, build: Callable[[Path], None], marker: dict) -> None:
    """Build a converted folder under a temporary name: the files, then ``checksums.json``
    (size and sha256 of every file), then the marker; rename it into place (an old or broken
    folder of that name is replaced only once the new one is complete)."""
    with atomic_dir(folder, replace=True) as tmp:
        build(tmp)
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        records = {p.relative_to(tmp).as_posix(): _file_record(p) for p in files}
        (tmp / CHECKSUMS).write_text(json.dumps({"format": CHECKSUM_FORMAT, "files": records},
                                                indent=1, sort_keys=True))


def _read_checksums(folder: Path) -> dict[str, dict[str, Any]] | None:
    try:
        data = json.loads((folder / CHECKSUMS).read_text(encoding="utf-8"))
        files = data.get("files") if data.get("format") == CHECKSUM_FORMAT else None
    except (OSError, ValueError, AttributeError):
        return None
    return files if isinstance(files, dict) and files else None


def _refresh_mtimes(folder: Path) -> None:
    """Record the current modification times of files whose hashes have just been checked."""
    files = _read_checksums(folder)
    if files is None:
        return
    for rel, rec in files.items():
        rec["mtime_ns"] = (folder / rel).stat().st_mtime_ns
    atomic_write_json(folder / CHECKSUMS, {"format": CHECKSUM_FORMAT, "files": files},
                      sort_keys=True)


def conversion_problem(folder: Path, *, full: bool = False) -> str | None:
    """What is wrong with a converted folder, or None when it is whole.

    The cheap check (``full=False``): the marker and ``checksums.json`` are there, every recorded
    file exists with its recorded size, and a file whose modification time changed since it was
    last hashed is hashed again. ``full=True`` hashes every file.
    """
    if not folder.is_dir():
        return "not converted yet"
    if not (folder / MARKER).is_file():
        return f"{MARKER} is missing (an unfinished conversion)"
    files = _read_checksums(folder)
    if files is None:
        return f"{CHECKSUMS} is missing or unreadable (written by an older mechsink, or damaged)"
    if MARKER not in files:
        return f"{CHECKSUMS} does not cover {MARKER}"
    rehashed = False
    for rel, rec in sorted(files.items()):
        path = folder / rel
        try:
            st = path.stat()
        except OSError:
            return f"{rel} is missing"
        if st.st_size != rec.get("size"):
            return f"{rel} has {st.st_size} bytes, {rec.get('size')} were written"
        if full or st.st_mtime_ns != rec.get("mtime_ns"):
            if assets.sha256_of(path) != rec.get("sha256"):
                return f"{rel} fails its sha256 check (changed since it was written)"
            rehashed = rehashed or st.st_mtime_ns != rec.get("mtime_ns")
    if rehashed:  # e.g. a copied cache: hashes good, times new; remember them
        try:
            _refresh_mtimes(folder)
        except OSError:
            pass  # a read-only cache still loads; it is hashed again next time
    return None


def say_rebuild(folder: Path, problem: str) -> None:
    print(f"mechsink: the cached conversion {folder} is damaged ({problem}); "
          "rebuilding it from its verified source.", file=sys.stderr, flush=True)

