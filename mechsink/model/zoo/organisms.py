"""Organisms: models mechsink trained or edited, saved as a folder it can load again.

An organism folder holds ``model.safetensors``, ``config.json``, tokenizer files and
``mechsink.json`` (the format and what made it: recipe, seed, ...); ``organism:<folder>`` loads
one, and ``organism:<name>`` one shipped in ``mechsink/organisms`` (each with the command that
reproduces it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechsink.errors import BadInputError, MechsinkError
from mechsink.io import atomic_dir
from mechsink.model.adapter import plain_hf_copy
from mechsink.model.zoo.cache import MARKER
from mechsink.model.zoo.folders import from_folder
from mechsink.progress import library_bars

ORGANISM_FORMAT = "mechsink-organism/1"
BUNDLED_ORGANISMS = Path(__file__).resolve().parents[2] / "organisms"


def save_organism(
    model: Any, folder: str | Path, *, tokenizer: Any = None, metadata: dict | None = None
) -> Path:
    """Save a model as an organism folder: ``model.safetensors``, ``config.json``, tokenizer files
    and ``mechsink.json`` (format, metadata). Written to a temporary folder, then renamed.

    ``model`` is a TransformerBridge or a plain transformers model; the folder must not exist.
    """
    hf = plain_hf_copy(model)
    tok = tokenizer if tokenizer is not None else getattr(model, "tokenizer", None)
    if tok is None:
        raise BadInputError("save_organism needs a tokenizer: pass tokenizer=...")
    folder = Path(folder)
    with atomic_dir(folder) as tmp, library_bars():  # "Writing model shards" follows ours
        hf.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        marker = {"format": ORGANISM_FORMAT, "kind": "organism", **(metadata or {})}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True))
    return folder


def organism_folder(ref: str) -> Path:
    """The folder of ``organism:<ref>``: a path, or the name of an organism shipped with mechsink
    (``mechsink/organisms/<name>``, each with the command that reproduces it)."""
    path = Path(ref)
    if not path.exists() and (BUNDLED_ORGANISMS / ref / MARKER).is_file():
        return BUNDLED_ORGANISMS / ref
    return path


def check_organism(folder: Path) -> None:
    """Raise a one-line error unless ``folder`` is an organism this mechsink can read."""
    marker = folder / MARKER
    if not folder.is_dir():
        raise MechsinkError(
            f"organism folder {str(folder)!r} does not exist: give the path of a folder written "
            "by mechsink (mechsink train ... --out DIR, or mechsink.model.zoo.save_organism)."
        )
    if not marker.is_file():
        raise MechsinkError(
            f"{str(folder)!r} is not a mechsink organism (no {MARKER}); for a plain transformers "
            f"folder use hf:{folder}"
        )
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise MechsinkError(f"{marker} is not valid JSON ({exc}): the organism folder is "
                            "damaged; write it again (save_organism or mechsink train).") from exc
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt != ORGANISM_FORMAT:
        raise MechsinkError(f"{marker} has format {fmt!r}; this mechsink reads {ORGANISM_FORMAT}.")
    if not (folder / "config.json").is_file():
        raise MechsinkError(f"organism folder {str(folder)!r} has no config.json: the folder is "
                            "incomplete; write it again (save_organism or mechsink train).")
    if not (folder / "model.safetensors").is_file():
        raise MechsinkError(f"organism folder {str(folder)!r} has no model.safetensors: the "
                            "folder is incomplete; write it again.")


def load_organism_hf(folder: Path, dtype: torch.dtype = torch.float32) -> tuple[nn.Module, Any]:
    """The (transformers model, tokenizer) of an organism folder, after checking it is one."""
    check_organism(folder)
    try:
        from transformers import AutoConfig

        AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise MechsinkError(f"{folder / 'config.json'} cannot be read as a transformers config "
                            f"({str(exc).splitlines()[0]}): write the organism again.") from exc
    return from_folder(folder, dtype, strict=True)  # weights that misfit: one line, no traceback


def organism_recipe(model_name: str) -> str | None:
    """The training recipe named in an ``organism:...`` model's ``mechsink.json`` (None for
    other models, and for organisms whose marker names none)."""
    if not model_name.startswith("organism:"):
        return None
    marker = organism_folder(model_name.removeprefix("organism:")) / MARKER
    try:
        name = json.loads(marker.read_text()).get("recipe") if marker.is_file() else None
    except (ValueError, AttributeError):
        name = None
    return str(name) if name else None

