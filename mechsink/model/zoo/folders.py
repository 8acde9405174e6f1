"""Load a model folder (config, weights, tokenizer) as a plain transformers model, refusing one
that would load with a made-up tokenizer or weights that do not match its config."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mechsink.errors import MechsinkError
from mechsink.model.variants import apply_variants, variants_of

# Any of these in a folder is a tokenizer transformers can load (without one, AutoTokenizer
# builds a tokenizer that knows a single token and turns every text into id 0).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model",
                   "spiece.model", "vocab.txt", "merges.txt")


def check_tokenizer_files(folder: Path) -> None:
    """Refuse a model folder that holds no tokenizer, before loading anything."""
    if any((folder / f).is_file() for f in TOKENIZER_FILES):
        return
    raise MechsinkError(
        f"{folder} holds no tokenizer files (none of {', '.join(TOKENIZER_FILES)}), and "
        "mechsink will not load a model with a made-up tokenizer. Save the tokenizer beside the "
        "weights (tokenizer.save_pretrained(folder)), or pass one: "
        "mechsink.load_model('hf:<folder>', tokenizer=tok), or load the model yourself and call "
        "mechsink.wrap(model, tokenizer=tok)."
    )


def from_folder(folder: Path, dtype: torch.dtype, own_tokenizer: bool = True, *,
                strict: bool = False) -> tuple[nn.Module, Any]:
    """The (transformers model, tokenizer) in ``folder`` (the tokenizer None when
    ``own_tokenizer=False``: the caller brings one). Weights that do not fit the config are
    refused first (:func:`check_weights_fit`; ``strict`` also refuses missing ones)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if own_tokenizer and isinstance(folder, Path):
        check_tokenizer_files(folder)
    config = AutoConfig.from_pretrained(str(folder))
    if isinstance(folder, Path):
        check_weights_fit(folder, config, strict=strict)
    if variants_of(config):
        model = _with_variants_from_folder(folder, config, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=dtype, attn_implementation="eager"
        )
    if not own_tokenizer:
        return model.eval(), None
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if len(tokenizer) < 2:
        raise MechsinkError(
            f"the tokenizer in {folder} knows {len(tokenizer)} token(s): it is not this model's "
            "tokenizer. Save the real one there, or pass it: "
            "mechsink.load_model(..., tokenizer=tok).")
    return model.eval(), tokenizer


def check_weights_fit(folder: Path, config: Any, *, strict: bool = False) -> None:
    """Refuse, in one line and before loading, a ``model.safetensors`` whose tensors do not fit
    ``config``: a tensor whose shape differs from the one the config builds (named, with both
    shapes) and, with ``strict`` (organisms, written by mechsink under the model's own names),
    a weight the file lacks (a tied ``lm_head`` may be absent). Only the file's header is read;
    the model is built on the meta device. A folder without that file is left to transformers.
    """
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    path = folder / "model.safetensors"
    if not path.is_file():
        return
    try:
        with safe_open(str(path), framework="pt") as f:
            found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as exc:  # not a safetensors file at all
        raise MechsinkError(f"{path} cannot be read as safetensors ({str(exc).splitlines()[0]}):"
                            " the file is damaged; write the model again.") from exc
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        apply_variants(model, variants_of(config))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for key, shape in expected.items():
        if key in found and found[key] != shape:
            raise MechsinkError(
                f"{path} does not match {folder / 'config.json'}: tensor {key} has shape "
                f"{list(found[key])}, the config expects {list(shape)}; the weights and the "
                "config come from different models (write the folder again, or fix config.json)."
            )
    params = {k for k, _ in model.named_parameters(remove_duplicate=False)}
    missing = sorted(k for k in params - set(found) if not k.endswith("lm_head.weight"))
    if strict and missing:
        raise MechsinkError(
            f"{path} does not match {folder / 'config.json'}: it has no tensor {missing[0]} "
            f"(expected shape {list(expected[missing[0]])}; {len(missing)} missing in all); the "
            "weights and the config come from different models (write the folder again)."
        )


def _with_variants_from_folder(folder: Path, config: Any, dtype: torch.dtype) -> nn.Module:
    """Build a model whose architecture mechsink edited (:mod:`mechsink.model.variants`), then
    load its weights."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    apply_variants(model, variants_of(config))
    return load_weights(model, folder).to(dtype)


def load_weights(model: nn.Module, folder: Path) -> nn.Module:
    """Load ``folder/model.safetensors`` into ``model`` in place; every weight must match (a
    tied ``lm_head`` may be absent from the file and is re-tied)."""
    from safetensors.torch import load_file

    missing, unexpected = model.load_state_dict(
        load_file(str(folder / "model.safetensors")), strict=False
    )
    if unexpected or [k for k in missing if not k.endswith("lm_head.weight")]:
        raise MechsinkError(f"{folder} does not match its config: missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]}")
    if missing:
        model.tie_weights()
    return model


def refused_pickle(ref: str, exc: Exception) -> str:
    """One line for a pickled weights file that ``torch.load(weights_only=True)`` refused: it
    names what the pickle asked for and says that none of it ran."""
    found = re.search(r"GLOBAL (\S+)", str(exc))
    what = f" (it asks for {found.group(1)})" if found else ""
    return (f"{ref}: its pickled weights (a .bin file) were refused{what}: they hold "
            "more than tensors, and mechsink loads pickles with torch.load(weights_only=True), "
            "so none of its code ran. Use a copy of the model saved as model.safetensors, or "
            "load it yourself only if you trust its source.")


def looks_like_a_path(ref: str) -> bool:
    """Whether ``hf:<ref>`` names a folder rather than a hub id (``org/name``): absolute, or
    starting with ``.``, ``~``, or holding more than one ``/``."""
    return (Path(ref).is_absolute() or ref.startswith((".", "~")) or ref.count("/") > 1
            or "\\" in ref)


def from_hub_or_folder(ref: str, dtype: torch.dtype,
                       own_tokenizer: bool = True) -> tuple[nn.Module, Any]:
    """``hf:<ref>``: a local folder, or a hub id transformers can load."""
    folder = Path(ref) if Path(ref).is_dir() else None
    if folder is None and looks_like_a_path(ref):  # not transformers' "Repo id must be ..."
        what = "is a file, not a folder" if Path(ref).exists() else "does not exist"
        raise MechsinkError(f"hf:{ref}: the folder {what}. Give a folder holding config.json, "
                            "weights and tokenizer files (or a hub id such as org/name on a "
                            "machine with hub access).")
    if folder is not None and own_tokenizer:
        check_tokenizer_files(folder)  # before the weights load: a clear error, fast
    try:
        return from_folder(folder or ref, dtype, own_tokenizer)  # type: ignore[arg-type]
    except pickle.UnpicklingError as exc:  # torch.load(weights_only=True) refused a payload
        raise MechsinkError(refused_pickle(ref, exc)) from None
    except (OSError, ValueError) as exc:
        raise MechsinkError(
            f"transformers could not load {ref!r}: {exc}\n"
            "Give a local folder holding config.json, weights and tokenizer files, or a hub id on "
            "a machine with hub access."
        ) from exc

