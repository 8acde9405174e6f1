"""Model names -> loaded models: the names :func:`load_model` understands, resolved.

- a named model (:mod:`mechsink.model.zoo.entries`): converted once from its verified source
  into the cache, checked on every load and rebuilt when damaged;
- ``random:<family>-<size>`` (:mod:`mechsink.model.zoo.random_init`): a fresh standard init
  from ``seed``;
- ``hf:<model id or local folder>``: any causal LM transformers can load;
- ``organism:<folder or bundled name>`` (:mod:`mechsink.model.zoo.organisms`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mechsink.errors import BadInputError, UnknownModelError
from mechsink.model.adapter import wrap_hf
from mechsink.model.finite import check_finite_weights
from mechsink.model.zoo.cache import (
    converted_dir,
    say_rebuild,
    write_conversion,
)
from mechsink.model.zoo.devices import resolve_device, resolve_dtype
from mechsink.model.zoo.entries import NAMED_MODELS
from mechsink.model.zoo.entry import ZooEntry
from mechsink.model.zoo.folders import from_folder, from_hub_or_folder
from mechsink.model.zoo.organisms import check_organism, load_organism_hf, organism_folder
from mechsink.model.zoo.random_init import random_config, random_hf_model, random_names
from mechsink.model.zoo.stale import conversion_lock, remove_leftovers
from mechsink.progress import library_bars

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge



def known_names() -> list[str]:
    """Every name and name pattern the zoo understands (used in error messages)."""
    return [*NAMED_MODELS, *random_names(), "hf:<id or folder>", "organism:<folder>"]


def load_model(
    name: str,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype | None = None,
    seed: int | None = None,
    fold_weights: bool = False,
    tokenizer: Any = None,
) -> TransformerBridge:
    """Load a model by zoo name as a TransformerBridge in compatibility mode.

    ``device`` defaults to CUDA when available, else CPU; ``dtype`` to float32; ``seed`` (random
    models only) to 0. ``fold_weights=False`` keeps the raw weights (see
    :mod:`mechsink.model.adapter`).
    ``tokenizer``: a transformers tokenizer to use instead of the model's own (needed for a
    folder that holds no tokenizer files, which is refused rather than given a made-up one).
    """
    torch_dtype = resolve_dtype(dtype)
    target = resolve_device(device)
    if seed is not None and not name.startswith("random:"):
        raise BadInputError(f"seed={seed} only applies to random:... models, not {name!r}.")
    # loading never moves the caller's RNG; transformers' own bars ("Loading weights") follow
    # mechsink's progress setting (shown on a terminal or in Jupyter, silent in logs)
    with torch.random.fork_rng(devices=[]), library_bars():
        hf_model, own = _load_hf(name, seed=0 if seed is None else seed, dtype=torch_dtype,
                                 own_tokenizer=tokenizer is None)
        check_finite_weights(hf_model, label=name)  # before any measurement (one pass)
        hf_model.to(device=target, dtype=torch_dtype)
        bridge = wrap_hf(hf_model, own if tokenizer is None else tokenizer, name=name,
                         fold_weights=fold_weights)
    # the zoo's name, not the architecture's reference checkpoint TransformerLens fills in
    # (qwen2.5-0.5b is Qwen2.5-Coder-0.5B-Instruct, not "Qwen/Qwen2.5-0.5B"): results that
    # name their model by cfg.model_name name the weights that ran
    bridge.cfg.model_name = name
    return bridge


def _load_hf(name: str, *, seed: int, dtype: torch.dtype,
             own_tokenizer: bool = True) -> tuple[nn.Module, Any]:
    """Resolve a zoo name to a plain (transformers model, tokenizer) pair (the tokenizer is
    None when ``own_tokenizer=False``: the caller brings one)."""
    if name in NAMED_MODELS:
        return _load_converted(NAMED_MODELS[name], dtype)
    prefix, _, rest = name.partition(":")
    if prefix == "random" and rest:
        return random_hf_model(rest, seed=seed)
    if prefix == "hf" and rest:
        return from_hub_or_folder(rest, dtype, own_tokenizer)
    if prefix == "organism" and rest:
        return load_organism_hf(organism_folder(rest), dtype)
    raise UnknownModelError(
        f"unknown model {name!r}. Known names: {', '.join(known_names())}. "
        "Run `mechsink models` for the list."
    )


def config_of(name: str) -> Any | None:
    """The transformers config of a zoo name, read without loading weights, or None when that
    needs the model itself (a named model not converted yet, a hub id). Unknown or malformed
    names raise the same errors :func:`load_model` would, before any work."""
    from transformers import AutoConfig

    prefix, _, rest = name.partition(":")
    folder: Path | None = None
    if name in NAMED_MODELS:
        folder = converted_dir(name)
        if NAMED_MODELS[name].problem() is not None:
            return None
    elif prefix == "random" and rest:
        return random_config(rest)
    elif prefix == "organism" and rest:
        folder = organism_folder(rest)
        check_organism(folder)
    elif prefix == "hf" and rest:
        folder = Path(rest) if Path(rest).is_dir() else None
    else:
        _load_hf(name, seed=0, dtype=torch.float32)  # raises the unknown-name error
    if folder is None or not (folder / "config.json").is_file():
        return None
    try:
        return AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError):
        return None  # load_model will say what is wrong


def context_of(name: str) -> int | None:
    """The context length (maximum positions) of a zoo name from its config, or None."""
    config = config_of(name)
    if config is None:
        return None
    n = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    return int(n) if n else None


def _convert(entry: ZooEntry, *, unless_whole: bool = True) -> None:
    """Build ``entry``'s converted folder (replacing a broken one), holding the model's
    conversion lock: a second process waits, then finds the folder whole (``unless_whole``)
    and converts nothing."""
    folder = converted_dir(entry.name)
    with conversion_lock(entry.name):
        if unless_whole and entry.problem() is None:
            return
        write_conversion(folder, entry.build, {"kind": "converted", "name": entry.name,
                                               "source": entry.source_record()},
                         pinned=entry.pinned)


def _load_converted(entry: ZooEntry, dtype: torch.dtype) -> tuple[nn.Module, Any]:
    """Load a converted model, checking it first; rebuild it when it is damaged or missing."""
    folder = converted_dir(entry.name)
    remove_leftovers(entry.name)  # what killed conversions left (their lock is free)
    problem = entry.problem()
    if problem is not None:
        if folder.exists():
            say_rebuild(folder, problem)
        _convert(entry)
    try:
        return from_folder(folder, dtype)
    except Exception:
        problem = entry.problem(full=True)
        if problem is None:
            raise  # the files are the ones written: not a cache problem
    say_rebuild(folder, problem)
    _convert(entry, unless_whole=False)
    return from_folder(folder, dtype)



def gguf_file(name: str) -> Path:
    """The verified GGUF file a named model is converted from (fetched, and joined where it
    ships in parts)."""
    entry = NAMED_MODELS.get(name)
    fetch = getattr(getattr(entry, "source", None), "fetch", None)
    if entry is None or fetch is None:
        raise UnknownModelError(f"{name!r} is not a zoo model converted from a GGUF file: "
                                f"choose one of {', '.join(NAMED_MODELS)}.")
    return fetch(name)
