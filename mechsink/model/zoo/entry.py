"""What the zoo knows about one named model: its name, what it is, and where it comes from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from mechsink.model.zoo.cache import Pinned, conversion_problem, converted_dir


@runtime_checkable
class Source(Protocol):
    """Where a named model's weights come from (:class:`~mechsink.model.zoo.gguf.GGUF`, ...)."""

    def build(self, folder: Path, name: str) -> None:
        """Write the model ``name`` (``model.safetensors``, config, tokenizer) into the empty
        ``folder``, from verified files only."""
        ...


@dataclass(frozen=True)
class ZooEntry:
    """A named model the zoo converts once into a cached folder, with a line saying what it is.

    ``source.build(folder, name)`` writes the model into an empty folder; the zoo adds the
    checksums and the marker (:mod:`mechsink.model.zoo.cache`). ``pinned``: the sha256 of the
    converted files, where the conversion is deterministic (checked on every load).
    """

    name: str
    description: str
    source: Source
    pinned: Pinned | None = None

    def build(self, folder: Path) -> None:
        """Write this model into the empty ``folder`` from its source."""
        self.source.build(folder, self.name)

    def source_record(self) -> Any:
        """What the converted folder records of its source (the source's pinned sha256s), or
        None for a source that pins nothing."""
        record = getattr(self.source, "record", None)
        return record() if callable(record) else None

    def problem(self, *, full: bool = False) -> str | None:
        """What is wrong with this model's converted folder, or None (see the cache)."""
        return conversion_problem(converted_dir(self.name), full=full,
                                  source=self.source_record(), pinned=self.pinned)

    def is_cached(self) -> bool:
        """True when the conversion is present and passes the cheap check (see the cache)."""
        return self.problem() is None


def by_name(*entries: ZooEntry) -> dict[str, ZooEntry]:
    """The entries keyed by name (a name given twice is a mistake in the table)."""
    table = {e.name: e for e in entries}
    if len(table) != len(entries):
        raise ValueError("two zoo entries share a name")
    return table
