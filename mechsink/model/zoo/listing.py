"""What ``mechsink models`` lists: every zoo name with its architecture, size and cache state."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

from mechsink.model.zoo.cache import converted_dir, proof
from mechsink.model.zoo.entries import NAMED_MODELS
from mechsink.model.zoo.random_init import FAMILIES, random_n_params
from mechsink.model.zoo.stale import leftovers

PATTERN_HELP = [
    *[(f"random:{f}-<size>", f"{family.label}, standard init; sizes {', '.join(family.sizes)}")
      for f, family in FAMILIES.items()],
    ("hf:<id or folder>", "any causal LM transformers can load (needs hub access for an id)"),
    ("organism:<folder>", "a checkpoint saved by mechsink (safetensors + config + tokenizer)"),
]


def list_models(*, verify: bool = False) -> list[dict[str, Any]]:
    """One row per zoo name: name, description, architecture, parameter count, cached,
    ``problem`` (why a converted folder that is there does not count as cached, else None) and
    ``stale`` (what killed conversions of it left behind: ``{"path", "bytes"}`` each, removed on
    its next load). ``verify=True`` hashes every converted file in full instead of the cheap
    check. ``proof``: what the check of a cached conversion compared its files with
    (:func:`~mechsink.model.zoo.cache.proof`)."""
    rows = []
    for entry in NAMED_MODELS.values():
        folder = converted_dir(entry.name)
        problem = entry.problem(full=verify) if folder.exists() else None
        cached = folder.exists() and problem is None
        arch, n_params = ("?", None)
        if cached:
            arch, n_params = _describe_folder(folder)
        rows.append(dict(name=entry.name, description=entry.description, architecture=arch,
                         n_params=n_params, cached=cached, problem=problem,
                         proof=proof(folder, entry.pinned) if cached else None,
                         stale=[left.to_dict() for left in leftovers(entry.name)]))
    for family, spec in FAMILIES.items():
        for size in spec.sizes:
            rows.append(dict(name=f"random:{family}-{size}",
                             description=f"random init ({family}, {size}); seed picks weights",
                             architecture=f"{family} (causal LM)",
                             n_params=random_n_params(f"{family}-{size}"),
                             cached=True, problem=None, proof=None, stale=[]))
    return rows


def _describe_folder(folder: Path) -> tuple[str, int]:
    """A converted folder's architecture (its config.json) and parameter count (the tensor
    shapes in its safetensors headers: no model is built, nothing but the headers is read)."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    archs = config.get("architectures")
    arch = archs[0] if archs else f"{config.get('model_type', '?')} (causal LM)"
    return arch, sum(safetensors_numel(p) for p in sorted(folder.glob("*.safetensors")))


def safetensors_numel(path: Path) -> int:
    """How many numbers a safetensors file holds, from its header alone (8 bytes of header
    length, then a JSON table of tensor shapes)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    return sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
