"""The result cache (one finished folder per kind, model and settings) and the model pool."""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from docs.build.plan import CACHE_VERSION
from mechsink.io import atomic_dir, atomic_write_json


def log(msg: str) -> None:
    print(f"[docs] {msg}", file=sys.stderr, flush=True)


def slug(name: str) -> str:
    """A file-name-safe model name (``organism:bb-gpt2-tiny`` -> ``organism-bb-gpt2-tiny``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")


class Cache:
    """Folders of finished results, one per (kind, model, settings)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.hits: list[str] = []
        self.runs: list[tuple[str, float]] = []

    def folder(self, kind: str, model: str, settings: Mapping[str, Any]) -> Path:
        key = json.dumps({"kind": kind, "model": model, "settings": settings,
                          "version": CACHE_VERSION}, sort_keys=True, default=str)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return self.root / f"{kind}-{slug(model)}-{digest}"

    def get(self, kind: str, model: str, settings: Mapping[str, Any],
            produce: Callable[[Path], None]) -> Path:
        """The finished folder for these settings, running ``produce(tmp_folder)`` if needed."""
        final = self.folder(kind, model, settings)
        if (final / ".done").is_file():
            self.hits.append(final.name)
            return final
        log(f"running {kind} on {model} ...")
        start = time.perf_counter()
        with atomic_dir(final, replace=True) as tmp:  # an unfinished folder is redone
            produce(tmp)
            took = time.perf_counter() - start
            atomic_write_json(tmp / "settings.json", {"kind": kind, "model": model,
                                                      "settings": settings,
                                                      "seconds": round(took, 1)},
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
