"""The verified conversion cache: folders the zoo builds once, checked on every load.

A converted folder (``<cache>/models/<name>/``) holds the model's files, ``mechsink.json`` (what
it is and the sha256 of the source it was decoded from) and ``checksums.json`` (size, sha256,
modification and change times of every file, written with them). Each load checks the folder
cheaply (present, sizes, the source it records, times: a file whose modification or change
time moved is hashed in full; restoring the modification time of an edited file still moves its
change time) and any load error triggers a full hash; a damaged, partial or missing conversion
is rebuilt from its verified source, saying so on stderr. Damage found by any check (a load, or
``mechsink models --verify``) is remembered in the folder (``DAMAGED``), so the next load
rebuilds it whoever found it.

What this proves: the files are the ones written by the conversion (damage, a cut copy, a
stale or partial conversion are found). ``checksums.json`` sits beside the weights, so on its
own it cannot prove the files were not rewritten on purpose by someone who can write to the
cache; where a zoo entry pins the hashes of its converted files (:class:`Pinned`, for the
transformers version that made them), the recorded hashes must equal those pins too.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechsink.io import atomic_dir, atomic_write_json, atomic_write_text
from mechsink.model import assets

MARKER = "mechsink.json"
CHECKSUMS = "checksums.json"
CHECKSUM_FORMAT = "mechsink-checksums/1"
DAMAGED = "DAMAGED"  # written into a folder found damaged: the next load rebuilds it


@dataclass(frozen=True)
class Pinned:
    """The sha256 of converted files (relative name -> hex) as the conversion from a zoo entry's
    pinned source makes them with transformers ``transformers`` (decoding a GGUF is
    deterministic for one version; another version may write other bytes, and then the pins
    do not apply: the files are checked against their own record only)."""

    transformers: str
    files: Mapping[str, str] = field(default_factory=dict)

    def applies(self) -> bool:
        """Whether the installed transformers is the version the pins were made with."""
        try:
            return importlib.metadata.version("transformers") == self.transformers
        except importlib.metadata.PackageNotFoundError:
            return False

    def mismatch(self, records: Mapping[str, Mapping[str, Any]]) -> str | None:
        """The first pinned file whose recorded sha256 differs from its pin, or None."""
        for rel, sha256 in sorted(self.files.items()):
            if records.get(rel, {}).get("sha256") != sha256:
                return rel
        return None


def models_dir() -> Path:
    """Where converted folders live (``<cache>/models``)."""
    return assets.cache_dir() / "models"


def converted_dir(name: str) -> Path:
    """The converted folder of the zoo model ``name`` (whether or not it exists yet)."""
    return models_dir() / name


def _file_record(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"size": st.st_size, "sha256": assets.sha256_of(path), "mtime_ns": st.st_mtime_ns,
            "ctime_ns": st.st_ctime_ns}


def write_conversion(folder: Path, build: Callable[[Path], None], marker: dict, *,
                     pinned: Pinned | None = None) -> None:
    """Build a converted folder under a temporary name: the files, then the marker (saying
    whether the files match ``pinned``, when given and applicable), then ``checksums.json``
    (size, sha256 and times of every file); rename it into place (an old or broken folder of
    that name is replaced only once the new one is complete)."""
    with atomic_dir(folder, replace=True) as tmp:
        build(tmp)
        built = {p.relative_to(tmp).as_posix(): _file_record(p)
                 for p in sorted(tmp.rglob("*")) if p.is_file()}
        marker = dict(marker)
        if pinned is not None and pinned.applies():
            off = pinned.mismatch(built)
            marker["pinned"] = off is None
            if off is not None:  # the source is verified, so this is the library, not damage
                print(f"mechsink: the conversion of {marker.get('name', folder.name)} wrote a "
                      f"{off} other than the one pinned for transformers {pinned.transformers}; "
                      "its files are checked against their own record only.",
                      file=sys.stderr, flush=True)
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
        records = {**built, MARKER: _file_record(tmp / MARKER)}
        (tmp / CHECKSUMS).write_text(json.dumps({"format": CHECKSUM_FORMAT, "files": records},
                                                indent=1, sort_keys=True))


def _read_checksums(folder: Path) -> dict[str, dict[str, Any]] | None:
    try:
        data = json.loads((folder / CHECKSUMS).read_text(encoding="utf-8"))
        files = data.get("files") if data.get("format") == CHECKSUM_FORMAT else None
    except (OSError, ValueError, AttributeError):
        return None
    return files if isinstance(files, dict) and files else None


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _times(st: Any) -> tuple[int, int]:
    return st.st_mtime_ns, st.st_ctime_ns


def _refresh_mtimes(folder: Path) -> None:
    """Record the current times of files whose hashes have just been checked."""
    files = _read_checksums(folder)
    if files is None:
        return
    for rel, rec in files.items():
        st = (folder / rel).stat()
        rec["mtime_ns"], rec["ctime_ns"] = _times(st)
    atomic_write_json(folder / CHECKSUMS, {"format": CHECKSUM_FORMAT, "files": files},
                      sort_keys=True)


def conversion_problem(folder: Path, *, full: bool = False, source: Any = None,
                       pinned: Pinned | None = None) -> str | None:
    """What is wrong with a converted folder, or None when it is whole.

    The cheap check (``full=False``): the marker and ``checksums.json`` are there, the marker
    records ``source`` (when given: the sha256 of what the folder must have been decoded
    from), every recorded file exists with its recorded size, the recorded hashes equal
    ``pinned`` (when given, applicable and the conversion matched it), a file whose
    modification or change time moved since it was last hashed is hashed again, and no
    damage was found in it before (``DAMAGED``).
    ``full=True`` hashes every file. Damage found (a size or a hash that differs) is
    remembered in the folder, so any later check finds it too.
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
    marker = _read_marker(folder)
    if source is not None and (marker or {}).get("source") != source and not (
            marker is not None and "source" not in marker
            and _adopt(folder, marker, files, source, pinned)):
        return (f"{MARKER} does not record the source this mechsink pins (converted by an older "
                "mechsink, or from another source)")
    if pinned is not None and pinned.applies() and (marker or {}).get("pinned") is True:
        off = pinned.mismatch(files)
        if off is not None:
            return _damaged(folder, f"{off} is not the file pinned for this model (its recorded "
                                    "sha256 was rewritten)")
    rehashed = False
    for rel, rec in sorted(files.items()):
        path = folder / rel
        try:
            st = path.stat()
        except OSError:
            return f"{rel} is missing"
        if st.st_size != rec.get("size"):
            return _damaged(folder, f"{rel} has {st.st_size} bytes, {rec.get('size')} were "
                                    "written")
        moved = _times(st) != (rec.get("mtime_ns"), rec.get("ctime_ns"))
        if full or moved:
            if assets.sha256_of(path) != rec.get("sha256"):
                return _damaged(folder, f"{rel} fails its sha256 check (changed since it was "
                                        "written)")
            rehashed = rehashed or moved
    try:
        earlier = (folder / DAMAGED).read_text(encoding="utf-8").strip()
    except OSError:
        earlier = None
    if earlier is not None:  # found by an earlier check that this one could not repeat
        return earlier or "found damaged earlier"
    if rehashed:  # e.g. a copied cache: hashes good, times new; remember them
        try:
            _refresh_mtimes(folder)
        except OSError:
            pass  # a read-only cache still loads; it is hashed again next time
    return None


def _adopt(folder: Path, marker: dict[str, Any], files: dict[str, dict[str, Any]], source: Any,
           pinned: Pinned | None) -> bool:
    """A folder converted before the marker recorded its source is kept (not converted again)
    when its recorded hashes equal the pins and every file matches them in full; its marker then
    records the source. Without pins that apply it is rebuilt."""
    if pinned is None or not pinned.applies() or not pinned.files \
            or pinned.mismatch(files) is not None:
        return False
    for rel, rec in files.items():
        path = folder / rel
        if not path.is_file() or assets.sha256_of(path) != rec.get("sha256"):
            return False
    try:
        text = json.dumps({**marker, "source": source, "pinned": True}, indent=2,
                          sort_keys=True)
        atomic_write_text(folder / MARKER, text)
        files[MARKER] = _file_record(folder / MARKER)
        for rel, rec in files.items():
            rec["mtime_ns"], rec["ctime_ns"] = _times((folder / rel).stat())
        atomic_write_json(folder / CHECKSUMS, {"format": CHECKSUM_FORMAT, "files": files},
                          sort_keys=True)
    except OSError:
        return True  # whole and pinned; a read-only cache is adopted again next time
    return True


def proof(folder: Path, pinned: Pinned | None) -> str:
    """What a passing full check of ``folder`` proves, in a few words."""
    if pinned is None:
        return "own record (no pins for this model)"
    if not pinned.applies():
        return f"own record (pins made with transformers {pinned.transformers})"
    if (_read_marker(folder) or {}).get("pinned") is not True:
        return "own record (this conversion did not reproduce the pins)"
    return "pinned hashes"


def _damaged(folder: Path, problem: str) -> str:
    """Remember that ``folder`` was found damaged (so the next load rebuilds it, even when the
    check that runs then could not see it); return ``problem``."""
    try:
        atomic_write_text(folder / DAMAGED, problem + "\n")
    except OSError:
        pass  # a read-only cache: found again by the next full check
    return problem


def say_rebuild(folder: Path, problem: str) -> None:
    print(f"mechsink: the cached conversion {folder} is damaged ({problem}); "
          "rebuilding it from its verified source.", file=sys.stderr, flush=True)

