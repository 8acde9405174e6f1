"""Atomic writes, writable-folder probes and one-writer-per-folder locks.

Every file mechsink writes goes through here: the data is written to a temporary name in the
target's folder and renamed into place (``os.replace``), so a crash or a kill never leaves a
half-written result where a reader would take it for a whole one. :func:`check_writable`
finds an unusable output folder before any work, and :func:`folder_lock` keeps a second
process from writing the same folder at the same time.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import shlex
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from mechsink.errors import BadInputError, MechsinkError, warn

__all__ = [
    "LOCK_FILE",
    "FolderLockedError",
    "check_writable",
    "folder_lock",
    "open_lock_file",
    "check_no_links",
    "atomic_file",
    "atomic_dir",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "json_text",
    "finite_json",
    "give_default_permissions",
    "MANIFEST",
    "DiskFullError",
    "IncompleteResultError",
    "full_disk_is_one_line",
    "result_set",
    "check_result_set",
    "manifest_path",
]


def give_default_permissions(path: Path) -> None:
    """Give a file (0666) or folder (0777) the permissions the umask allows: temporary files
    and folders are created owner-only, and what mechsink renames into place should not be."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, (0o777 if Path(path).is_dir() else 0o666) & ~mask)


@contextmanager
def atomic_file(target: Path) -> Iterator[tuple[Path, IO[bytes]]]:
    """Open a temporary file beside ``target``; rename it into place only if the block succeeds."""
    target = Path(target)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            yield tmp, out
        give_default_permissions(tmp)  # mkstemp makes 0600
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(target: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``target`` atomically (its folder is created if needed)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(target) as (_, out):
        out.write(data)
    return target


def atomic_write_text(target: str | Path, text: str) -> Path:
    """Text version of :func:`atomic_write_bytes` (UTF-8)."""
    return atomic_write_bytes(target, text.encode("utf-8"))


REASON_SUFFIX = "_reason"  # the field beside a value that held non-finite numbers


def _plain(value: Any) -> Any:
    """JSON's fallback for what it cannot write: numpy and torch scalars and arrays as their
    Python values (``tolist``), paths and the rest as their text."""
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _nonfinite(x: float) -> str:
    return "NaN" if math.isnan(x) else ("inf" if x > 0 else "-inf")


def finite_json(data: Any) -> Any:
    """``data`` with every non-finite float (NaN, inf, -inf) replaced by ``None``; a dict key
    whose value held any gets a field ``KEY_reason`` beside it saying what was there (e.g.
    ``"not finite: 2 NaN, 1 inf (written as null)"``), so a reader never takes a lost number
    for ``0.0`` and the JSON stays strict (no ``NaN`` literals). (A bare list at the top level
    has no key: its nulls stand alone.) A reason field the data already has is kept."""

    def walk(obj: Any, seen: dict[str, int]) -> Any:
        if isinstance(obj, float):
            if math.isfinite(obj):
                return obj
            kind = _nonfinite(obj)
            seen[kind] = seen.get(kind, 0) + 1
            return None
        if isinstance(obj, dict):
            out: dict[Any, Any] = {}
            for key, value in obj.items():
                mine: dict[str, int] = {}
                out[key] = walk(value, mine)
                if mine:
                    for kind, count in mine.items():
                        seen[kind] = seen.get(kind, 0) + count
                    reason = f"{key}{REASON_SUFFIX}"
                    if reason not in obj and not isinstance(value, dict):  # a dict says so inside
                        out[reason] = "not finite: " + ", ".join(
                            f"{c} {k}" for k, c in sorted(mine.items())) + " (written as null)"
            return out
        if isinstance(obj, (list, tuple)):
            return [walk(v, seen) for v in obj]
        if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
            return walk(obj.tolist(), seen)
        return obj

    return walk(data, {})


def json_text(data: Any, *, indent: int | None = 1, sort_keys: bool = False) -> str:
    """``data`` as strict JSON text with a final newline: non-finite numbers are ``null`` with a
    reason beside them (:func:`finite_json`), never a ``NaN`` literal (``allow_nan=False``)."""
    return json.dumps(finite_json(data), indent=indent, sort_keys=sort_keys, default=_plain,
                      allow_nan=False) + "\n"


def atomic_write_json(target: str | Path, data: Any, *, indent: int = 1,
                      sort_keys: bool = False) -> Path:
    """``data`` as strict JSON (:func:`json_text`: non-finite numbers are ``null`` with a reason
    beside them), written atomically."""
    return atomic_write_text(target, json_text(data, indent=indent, sort_keys=sort_keys))


@contextmanager
def atomic_dir(target: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """Build a folder under a temporary name beside ``target``; rename it into place on success.

    Without ``replace`` an existing target is an error (nothing is overwritten); with it, the
    old folder is swapped out only once the new one is complete. A failed build leaves nothing.
    """
    target = Path(target)
    if target.exists() and not replace:
        raise BadInputError(f"{target} already exists: choose a new folder or delete the old one.")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent))
    try:
        yield tmp
        give_default_permissions(tmp)  # mkdtemp makes 0700
        if replace and target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old",
                                        dir=target.parent))
            os.replace(target, old / "x")
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                os.replace(tmp, target)
            except OSError:
                if not target.is_dir():  # not a lost race with another process: report it
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- output folders: found writable before the work, one writer at a time ------------------

LOCK_FILE = ".mechsink.lock"


class FolderLockedError(BadInputError):
    """Another live process holds the advisory lock on an output folder."""


def check_writable(folder: str | Path, *, option: str = "--out") -> Path:
    """Create ``folder`` if needed and write then remove a probe file in it; return the path.

    Run before loading a model, so a folder that cannot be written (``/proc/x``, a read-only
    mount, an existing file, ``""``) is an error before the work instead of a traceback after it.
    """
    if str(folder).strip() == "":
        raise BadInputError(f"{option} is empty: give the folder to write into.")
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise BadInputError(f"{option} {path} is a file, not a folder: give a folder path.")
    new = [p for p in (path, *path.parents) if not p.exists()]  # what mkdir will create
    try:
        path.mkdir(parents=True, exist_ok=True)
        _created.extend(new)
        fd, probe = tempfile.mkstemp(prefix=".mechsink-probe.", dir=path)
        try:
            os.write(fd, b"probe")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise BadInputError(
            f"{option} {path} cannot be written ({why}): choose a folder you can write to."
        ) from exc
    return path


_created: list[Path] = []  # folders check_writable made (deepest first), for remove_unused_folders


def remove_unused_folders() -> None:
    """Remove the folders :func:`check_writable` created that are still empty (a command that
    failed before writing anything leaves no empty ``--out`` folder behind)."""
    kept = []
    for folder in sorted(set(_created), key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()  # only when empty; a folder in use stays (a later call may retry)
        except FileNotFoundError:
            pass
        except OSError:
            kept.append(folder)
    _created[:] = kept


_held: dict[Path, int] = {}  # folders this process holds the lock of -> nesting depth
_held_guard = threading.Lock()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _read_holder(lock: Path) -> dict[str, Any]:
    try:
        data = json.loads(lock.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _locked_error(folder: Path, holder: dict[str, Any]) -> FolderLockedError:
    who = f"process {holder.get('pid', '?')}"
    if holder.get("command"):
        who += f" ({holder['command']})"
    return FolderLockedError(
        f"{folder} is being written by {who}: wait for it to finish, or choose another folder. "
        f"(If that process is gone, delete {folder / LOCK_FILE}.)"
    )


def open_lock_file(path: Path) -> int:
    """Open (creating it if needed) the lock file ``path`` for reading and writing, never
    through a symbolic link: created with ``O_CREAT | O_EXCL | O_NOFOLLOW``, or, when one is
    already there (a lock left by a dead process), opened with ``O_NOFOLLOW``. A link, or
    anything but a plain file with a single name (a hard link to another file), is refused in
    one line: a lock's holder truncates and rewrites it, which must never reach another file."""
    flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):
        try:
            return os.open(path, flags | os.O_CREAT | os.O_EXCL | nofollow, 0o644)
        except FileExistsError:
            pass
        try:
            fd = os.open(path, flags | nofollow | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            continue  # removed by its holder in between: create it
        except OSError as exc:
            if exc.errno == errno.ELOOP or path.is_symlink():
                raise BadInputError(
                    f"{path} is a symbolic link where mechsink keeps a lock file: mechsink never "
                    "writes through a link; delete it and run again.") from None
            raise BadInputError(f"{path} cannot be opened as a lock file "
                                f"({exc.strerror or type(exc).__name__}): delete it or choose "
                                "another folder.") from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            os.close(fd)
            what = "a hard link to another file" if stat.S_ISREG(st.st_mode) else "not a file"
            raise BadInputError(f"{path} is {what} where mechsink keeps a lock file: delete it "
                                "and run again.")
        os.set_blocking(fd, True)
        return fd
    raise BadInputError(f"{path} keeps appearing and disappearing: run again.")


def check_no_links(folder: Path, names: Iterable[str], *, option: str = "--out") -> None:
    """Refuse, in one line and before any work, when one of the subfolders ``names`` that a
    command writes into inside ``folder`` is a symbolic link (its files would land wherever the
    link points, outside ``folder``)."""
    for name in names:
        path = Path(folder) / name
        if path.is_symlink():
            raise BadInputError(
                f"{path} is a symbolic link (to {os.readlink(path)}): mechsink writes only inside "
                f"{option} {folder}, never through a link; remove the link or choose another "
                "folder.")


@contextmanager
def folder_lock(folder: str | Path, *, command: str | None = None) -> Iterator[Path]:
    """Hold the advisory lock of output folder ``folder`` for the block (one writer per folder).

    The lock is ``folder/.mechsink.lock``, holding the holder's pid and command line, and an
    exclusive ``flock`` on it. A second process fails at once with a
    :class:`FolderLockedError` naming the first. A lock left by a dead process (its pid no
    longer runs, so the kernel has dropped its ``flock``) is taken over. The same process may
    nest locks on one folder. The folder is created if needed; the lock file is removed on exit.
    """
    import fcntl

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    key = path.resolve()
    with _held_guard:
        if key in _held:
            _held[key] += 1
            nested = True
        else:
            nested = False
    if nested:
        try:
            yield path
        finally:
            with _held_guard:
                _held[key] -= 1
        return
    lock = key / LOCK_FILE
    info = {"pid": os.getpid(), "command": command or shlex.join(sys.argv)}
    for _ in range(100):
        fd = open_lock_file(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _read_holder(lock)
            pid = holder.get("pid")
            if isinstance(pid, int) and not _pid_alive(pid):
                time.sleep(0.05)  # a dying holder: its flock goes with it, then we take over
                continue
            raise _locked_error(path, holder) from None
        try:  # the file may have been removed (and re-made) between open and flock: retry then
            same = os.path.samestat(os.fstat(fd), os.stat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise _locked_error(path, _read_holder(lock))
    try:
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps(info) + "\n").encode("utf-8"))
        os.fsync(fd)
        with _held_guard:
            _held[key] = 1
        yield path
    finally:
        with _held_guard:
            _held.pop(key, None)
        try:
            lock.unlink()  # while still holding the flock: no one else can own this file
        except FileNotFoundError:
            pass
        os.close(fd)


# --- result sets: a command's folder holds one whole result or the previous one -----------------

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "mechsink-manifest/1"
_STAGING = ".mechsink-staging-"
_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(MechsinkError, OSError):
    """The disk (or quota) filled up while a result was written; the previous result stands."""


@contextmanager
def full_disk_is_one_line(folder: str | Path, *, kept: str = "the previous result there is "
                          "untouched") -> Iterator[None]:
    """Turn a full disk or quota (``OSError`` ENOSPC / EDQUOT) raised in the block into a
    :class:`DiskFullError`: one line naming ``folder`` and what was ``kept``, no traceback."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as exc:
        if exc.errno in _FULL:
            raise DiskFullError(
                f"the disk is full ({exc.strerror or 'no space left'}) while writing into "
                f"{folder}: free some space and run the command again; {kept}.") from None
        raise


class IncompleteResultError(MechsinkError):
    """A result folder whose files do not match its manifest (a write was cut short)."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _files_below(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def _read_manifest(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT else None


def _manifest_names(manifest: dict[str, Any]) -> list[str]:
    files = manifest.get("files")
    return [str(name) for name in files] if isinstance(files, dict) else []


def manifest_path(folder: Path, name: str) -> Path | None:
    """Where the manifest entry ``name`` of ``folder`` lies, or None when it does not name a
    path inside ``folder``: an absolute path, a ``..`` part, an empty name, or a path through a
    symbolic link leading out of the folder (a planted manifest must never make mechsink read,
    write or delete anything elsewhere). The last part may itself be a link: it is the link
    that is meant (removed, never followed)."""
    rel = Path(name)
    if not name or rel.is_absolute() or ".." in rel.parts or rel.parts in ((), (".",)):
        return None
    path = folder / rel
    root = folder.resolve()
    try:
        parent = path.parent.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        return None
    if parent != root and not parent.is_relative_to(root):
        return None
    return path


def _remove_dead_staging(folder: Path) -> None:
    """Staging folders of processes that no longer run (killed mid-write) are thrown away."""
    for old in folder.glob(_STAGING + "*"):
        pid = old.name[len(_STAGING):].split("-", 1)[0]
        if not pid.isdigit() or not _pid_alive(int(pid)) or int(pid) == os.getpid():
            shutil.rmtree(old, ignore_errors=True)


@contextmanager
def result_set(folder: str | Path, *, command: str | None = None) -> Iterator[Path]:
    """Write a command's whole result set into a staging folder; swap it into ``folder`` only
    when the block succeeds, and write ``folder/manifest.json`` (every file, size, sha256) last.

    While the block runs, ``folder`` keeps its previous result untouched: a kill, an error or a
    full disk (a :class:`DiskFullError`, one line) leaves the previous complete set and its
    manifest as they were. During the swap itself (renames only) the manifest is absent, so a
    reader that checks it (:func:`check_result_set`) never takes a mixed set for a whole one.
    Files of the previous set that the new one does not write are removed.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _remove_dead_staging(folder)
    staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING}{os.getpid()}-", dir=folder))
    try:
        with full_disk_is_one_line(folder):
            yield staging
            new = [p.relative_to(staging) for p in _files_below(staging)]
            entries = {str(r): {"bytes": (staging / r).stat().st_size,
                                "sha256": _sha256(staging / r)} for r in new}
            manifest = {"format": MANIFEST_FORMAT, "command": command or shlex.join(sys.argv),
                        "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": entries}
            # probe the space the manifest needs before the old set is touched
            atomic_write_json(staging / MANIFEST, manifest)
        old = _read_manifest(folder)
        (folder / MANIFEST).unlink(missing_ok=True)  # from here until the end: incomplete
        for top in sorted({r.parts[0] for r in new}):
            target = folder / top
            if target.is_symlink():
                target.unlink()  # replaced by the new file or folder, never written through
            elif target.is_dir():
                shutil.rmtree(target)
            os.replace(staging / top, target)
        if old is not None:
            for name in sorted(set(_manifest_names(old)) - set(entries)):
                path = manifest_path(folder, name)
                if path is None:
                    warn(f"{folder / MANIFEST} names {name!r}, which is not a file inside "
                         f"{folder}: left alone (a manifest only ever lists its own folder's "
                         "files; this one was edited or planted).")
                elif not path.is_dir() or path.is_symlink():
                    path.unlink(missing_ok=True)  # a link is removed, never followed
        os.replace(staging / MANIFEST, folder / MANIFEST)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_result_set(folder: str | Path, *, full: bool = False) -> dict[str, Any]:
    """The manifest of a result folder written by :func:`result_set`; an
    :class:`IncompleteResultError` when it is missing or a file differs from it (sizes; with
    ``full``, sha256 too)."""
    folder = Path(folder)
    manifest = _read_manifest(folder)
    if manifest is None:
        raise IncompleteResultError(
            f"{folder} holds no complete mechsink result (no {MANIFEST}: the command that "
            "wrote it did not finish): run it again.")
    files = manifest.get("files")
    for name, entry in (files.items() if isinstance(files, dict) else ()):
        path = manifest_path(folder, str(name))
        if path is None or path.is_symlink():
            raise IncompleteResultError(
                f"{folder / MANIFEST} names {name!r}, which is not a file inside {folder}: "
                "this manifest was not written by mechsink; run the command again.")
        if not isinstance(entry, dict) or not path.is_file() or \
                path.stat().st_size != entry.get("bytes") or (
                full and _sha256(path) != entry.get("sha256")):
            raise IncompleteResultError(
                f"{path} does not match {folder / MANIFEST} (changed or cut short since the "
                "result was written): run the command again.")
    return manifest
