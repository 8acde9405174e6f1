"""Write a freshly initialised model of any transformers config as an ``hf:`` folder, shard by
shard, without ever holding the whole model: a model of a large model's shapes (Llama-3-8B's,
16 GB in bfloat16) to measure time and memory on before the real weights are at hand.

Each tensor is drawn on its own, directly in the target dtype, from a generator seeded by the
seed and the tensor's name (the same seed gives the same tensor whatever the sharding), and the
writer holds at most one shard at a time: its peak is one shard, never a float32 copy. The init
is the usual one of causal LMs in transformers (``initializer_range``): normal weight matrices
and embeddings, norm weights one, biases zero.
"""

from __future__ import annotations

import copy
import json
import zlib
from pathlib import Path
from typing import Any

import torch

from mechsink.errors import BadInputError
from mechsink.io import atomic_dir
from mechsink.model.zoo.devices import resolve_dtype

GiB = 2**30
INDEX = "model.safetensors.index.json"


def tensor_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of ``config`` saves, by name, in the model's order (a tied
    ``lm_head`` is left out, as ``save_pretrained`` leaves it out). Built on the meta device:
    no memory."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return {k: tuple(v.shape) for k, v in model.state_dict().items()
            if not (tied and k.endswith("lm_head.weight"))}


def init_tensor(name: str, shape: tuple[int, ...], dtype: torch.dtype, *, seed: int,
                std: float) -> torch.Tensor:
    """One tensor of a fresh model, drawn in ``dtype`` from ``seed`` and its name: normal(0,
    ``std``) for matrices and embeddings, ones for a norm's weight, zeros for a bias."""
    if len(shape) == 1:
        module = name.rsplit(".", 2)[-2].lower() if name.count(".") else ""
        norm = "norm" in module or module.startswith("ln")
        return torch.full(shape, 1.0 if norm and name.endswith("weight") else 0.0, dtype=dtype)
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.empty(shape, dtype=dtype).normal_(0.0, std, generator=g)


def plan_shards(shapes: dict[str, tuple[int, ...]], itemsize: int,
                shard_bytes: int) -> list[list[str]]:
    """Tensor names grouped into shards of at most ``shard_bytes`` (a larger tensor alone)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        n = itemsize * int(torch.Size(shape).numel())
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    return shards


def write_random_hf_folder(config: Any, out: str | Path, dtype: str | torch.dtype = "bfloat16",
                           *, seed: int = 0, shard_bytes: int = 2 * GiB,
                           tokenizer: Any = None) -> Path:
    """Write a fresh model of ``config`` to the new folder ``out`` (safetensors shards, their
    index, ``config.json``, the tokenizer) and return it; load it as ``hf:<out>``.

    ``tokenizer`` (default: GPT-2's BPE, 50,257 tokens) must not know more tokens than the
    config's vocabulary. Written under a temporary name and renamed: a killed writer leaves no
    folder a loader could take for a whole one.
    """
    from safetensors.torch import save_file

    from mechsink.model.zoo.tokenizer import gpt2_tokenizer

    torch_dtype = resolve_dtype(dtype)
    if shard_bytes < 1:
        raise BadInputError(f"shard_bytes must be a positive number of bytes, got {shard_bytes}.")
    tok = gpt2_tokenizer() if tokenizer is None else tokenizer
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if len(tok) > vocab:
        raise BadInputError(f"the tokenizer knows {len(tok)} tokens but the config's vocabulary "
                            f"holds {vocab}: give a config with vocab_size >= {len(tok)}.")
    shapes = tensor_shapes(config)
    std = float(getattr(config, "initializer_range", 0.02))
    itemsize = torch.empty((), dtype=torch_dtype).element_size()
    shards = plan_shards(shapes, itemsize, shard_bytes)
    weight_map: dict[str, str] = {}
    with atomic_dir(out) as tmp:
        for i, names in enumerate(shards, start=1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            tensors = {n: init_tensor(n, shapes[n], torch_dtype, seed=seed, std=std)
                       for n in names}
            save_file(tensors, str(tmp / file), metadata={"format": "pt"})
            del tensors  # one shard in memory at a time
            weight_map.update(dict.fromkeys(names, file))
        total = itemsize * sum(int(torch.Size(s).numel()) for s in shapes.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
        saved = copy.deepcopy(config)
        saved.dtype = torch_dtype  # what from_pretrained reads as the weights' own dtype
        saved.save_pretrained(tmp)
        tok.save_pretrained(tmp)
    return Path(out)
