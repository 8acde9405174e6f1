"""One conversion per model at a time, and the leftovers of killed ones cleared away.

A conversion builds ``<cache>/models/.<name>.XXXXXXXX.part`` and renames it into place; a
process killed on the way leaves that folder behind (hundreds of MB, or the 1.1 GB joined GGUF
in ``<cache>/assets/<name>/``). Each conversion therefore holds ``<cache>/models/.<name>.lock``
(an exclusive ``flock``, with the holder's pid written in it): a second process waits for the
first instead of converting twice, and a leftover whose model's lock nobody holds belongs to a
process that is gone. :func:`leftovers` lists them (``mechsink models`` shows them) and
:func:`remove_leftovers` deletes them (the next load of that model does).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mechsink.io import open_lock_file
from mechsink.model import assets
from mechsink.model.zoo.cache import models_dir

_local = threading.local()  # .held: model name -> nesting depth of this thread's lock


def _held() -> dict[str, int]:
    if not hasattr(_local, "held"):
        _local.held = {}
    return _local.held


def lock_path(name: str) -> Path:
    """The lock file of model ``name``'s conversions (kept: it holds nothing but a pid)."""
    return models_dir() / f".{name}.lock"


@contextmanager
def conversion_lock(name: str) -> Iterator[None]:
    """Hold model ``name``'s conversion lock for the block, waiting while another process holds
    it (another thread too); re-entrant within one thread (a conversion fetches its GGUF under
    the same lock)."""
    import fcntl

    held = _held()
    if held.get(name):
        held[name] += 1
        try:
            yield
        finally:
            held[name] -= 1
        return
    path = lock_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_lock_file(path)  # never through a link planted in the cache
    try:
        if not _try_flock(fd):
            print(f"mechsink: waiting for {_holder(path)} to finish converting {name}",
                  file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.write(fd, (json.dumps({"pid": os.getpid()}) + "\n").encode())
        held[name] = 1
        yield
    finally:
        held.pop(name, None)
        os.close(fd)  # drops the flock


def _try_flock(fd: int) -> bool:
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder(path: Path) -> str:
    try:
        pid = json.loads(path.read_text(encoding="utf-8")).get("pid")
    except (OSError, ValueError, AttributeError):
        pid = None
    return f"process {pid}" if isinstance(pid, int) else "another process"


def lock_is_held(name: str) -> bool:
    """Whether some process or thread (this one included) holds model ``name``'s conversion
    lock now."""
    if _held().get(name):
        return True
    path = lock_path(name)
    if not path.is_file():
        return False
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return False
    try:
        if not _try_flock(fd):
            return True
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Leftover:
    """A folder or file a killed conversion of ``name`` left behind, and its size."""

    name: str
    path: Path
    size: int

    def to_dict(self) -> dict[str, object]:
        return {"path": str(self.path), "bytes": self.size}


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _candidates(name: str) -> list[Path]:
    """Temporary folders of ``name``'s conversions (``mechsink.io.atomic_dir``: ``.part``, and
    ``.old`` for the folder being replaced) and temporary files of its joined GGUF."""
    tmp = re.compile(rf"^\.{re.escape(name)}\.[A-Za-z0-9_]+\.(part|old)$")
    found = [p for p in models_dir().glob(f".{name}.*") if tmp.match(p.name)] \
        if models_dir().is_dir() else []
    joined = assets.cache_dir() / "assets" / name
    if joined.is_dir():
        found += [p for p in joined.glob(".*.part") if p.is_file()]
    return sorted(found)


def leftovers(name: str) -> list[Leftover]:
    """What killed conversions of model ``name`` left behind (nothing while one is running:
    its lock is held, so its temporary files are not leftovers)."""
    found = _candidates(name)
    if not found or lock_is_held(name):
        return []
    return [Leftover(name, p, _size(p)) for p in found]


def remove_leftovers(name: str) -> list[Leftover]:
    """Delete what killed conversions of model ``name`` left behind, saying so on stderr; the
    removed leftovers are returned. Nothing is touched while a conversion of that model runs
    (in this process or another: its lock is held), and the removal holds the lock itself."""
    if not _candidates(name) or lock_is_held(name):
        return []
    with conversion_lock(name):
        found = [Leftover(name, p, _size(p)) for p in _candidates(name)]
        for left in found:
            if left.path.is_dir():
                shutil.rmtree(left.path, ignore_errors=True)
            else:
                left.path.unlink(missing_ok=True)
    if found:
        total = sum(left.size for left in found) / 1e6
        print(f"mechsink: removed {len(found)} leftover(s) of a killed {name} conversion "
              f"({total:.0f} MB): {', '.join(str(left.path) for left in found)}",
              file=sys.stderr, flush=True)
    return found
