"""The result cache (one finished folder per kind, model and settings) and the model pool."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from docs.build.plan import CACHE_VERSION, ROOT
from mechsink.io import atomic_dir, atomic_write_json


def log(msg: str) -> None:
    print(f"[docs] {msg}", file=sys.stderr, flush=True)


def slug(name: str) -> str:
    """A file-name-safe model name (``organism:bb-gpt2-tiny`` -> ``organism-bb-gpt2-tiny``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")


def code_digest() -> str:
    """sha256 of mechsink's source (every ``mechsink/**/*.py``), recorded with each result so a
    build can say which cached results older code made."""
    h = hashlib.sha256()
    for f in sorted((ROOT / "mechsink").rglob("*.py")):
        h.update(f.relative_to(ROOT).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


class Cache:
    """Folders of finished results, one per (kind, model, settings).

    A result is re-run when its key changes (the settings, and for experiments, snippets and
    notebooks the code they run) or when asked: ``rerun`` holds shell patterns of kinds
    (``scan``, ``circuit-*``). Results made by other mechsink code are reused but listed in
    ``stale`` (the build prints them)."""

    def __init__(self, root: Path, rerun: tuple[str, ...] = ()) -> None:
        self.root = Path(root)
        self.rerun = tuple(rerun)
        self.hits: list[str] = []
        self.runs: list[tuple[str, float]] = []
        self.stale: list[str] = []
        self._code: str | None = None

    @property
    def code(self) -> str:
        if self._code is None:
            self._code = code_digest()
        return self._code

    def folder(self, kind: str, model: str, settings: Mapping[str, Any]) -> Path:
        key = json.dumps({"kind": kind, "model": model, "settings": settings,
                          "version": CACHE_VERSION}, sort_keys=True, default=str)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return self.root / f"{kind}-{slug(model)}-{digest}"

    def get(self, kind: str, model: str, settings: Mapping[str, Any],
            produce: Callable[[Path], None]) -> Path:
        """The finished folder for these settings, running ``produce(tmp_folder)`` if needed."""
        final = self.folder(kind, model, settings)
        asked = any(fnmatch.fnmatchcase(kind, p) for p in self.rerun)
        if (final / ".done").is_file() and not asked:
            self.hits.append(final.name)
            try:
                made_by = json.loads((final / "settings.json").read_text("utf-8")).get(
                    "mechsink_code")
            except (OSError, ValueError):
                made_by = None
            if made_by != self.code:
                self.stale.append(final.name)
            return final
        log(f"running {kind} on {model} ...")
        start = time.perf_counter()
        with atomic_dir(final, replace=True) as tmp:  # an unfinished folder is redone
            produce(tmp)
            took = time.perf_counter() - start
            atomic_write_json(tmp / "settings.json", {"kind": kind, "model": model,
                                                      "settings": settings,
                                                      "seconds": round(took, 1),
                                                      "mechsink_code": self.code},
                              sort_keys=True)
            (tmp / ".done").touch()
        self.runs.append((final.name, took))
        log(f"{kind} on {model}: {took:.1f} s")
        return final


class Models:
    """Loads each model once per build, only when a result is not cached."""

    def __init__(self) -> None:
        self._loaded: dict[str, Any] = {}

    def __call__(self, name: str) -> Any:
        if name not in self._loaded:
            from mechsink.model.zoo import load_model

            self._loaded.clear()  # one model in memory at a time
            self._loaded[name] = load_model(name, device="cpu",
                                            seed=0 if name.startswith("random:") else None)
        return self._loaded[name]
