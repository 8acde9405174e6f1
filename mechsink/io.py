"""Atomic writes: a file or folder appears whole under its final name, or not at all.

Every file mechsink writes goes through here: the data is written to a temporary name in the
target's folder and renamed into place (``os.replace``), so a crash or a kill never leaves a
half-written result where a reader would take it for a whole one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from mechsink.errors import BadInputError

__all__ = [
    "atomic_file",
    "atomic_dir",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "give_default_permissions",
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


def atomic_write_json(target: str | Path, data: Any, *, indent: int = 1,
                      sort_keys: bool = False) -> Path:
    """``data`` as JSON (with a final newline), written atomically."""
    text = json.dumps(data, indent=indent, sort_keys=sort_keys, default=str) + "\n"
    return atomic_write_text(target, text)


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
