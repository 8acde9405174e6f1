"""Tiny random-init models of every decoder-only architecture the installed TransformerLens
bridge registers, built from transformers configs (no download) and saved as folders.

The architecture list is read from TransformerLens's own adapter registry
(``SUPPORTED_ARCHITECTURES``), keeping the causal-LM classes transformers itself defines. Each
model has 2 layers, small widths, grouped-query attention where the family has it (2 KV heads
for 4 query heads), the organism tokenizer shipped in mechsink (65 tokens, ``<bos>`` = 64) and
weights scaled up so logits reach realistic sizes (tens) and Gemma 2's soft-caps and Cohere's
logit scale change the answer.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

TOKENIZER_DIR = Path(__file__).resolve().parents[2] / "mechsink" / "organisms" / "bb-gpt2-tiny"
VOCAB = 65
BOS = 64
N_LAYERS = 2
D_MODEL = 64
N_HEADS = 4
N_KV = 2
LOGIT_SIZE = 40.0  # the largest |logit| on the probe tokens: Gemma 2's soft-cap (30) bites
PROBE = [[BOS, 3, 17, 5, 9, 22, 40, 8, 3, 17], [BOS, 11, 2, 30, 7, 7, 50, 1, 11, 2]]

# Config fields set on every tiny model where the config has them (transformers' own names;
# the configs' attribute maps translate n_layer, n_embd, ...).
TINY = {
    "num_hidden_layers": N_LAYERS, "hidden_size": D_MODEL, "num_attention_heads": N_HEADS,
    "intermediate_size": 128, "ffn_dim": 128, "n_inner": 128, "d_ff": 128,
    "head_dim": D_MODEL // N_HEADS, "vocab_size": VOCAB, "max_position_embeddings": 128,
    "n_positions": 128, "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4,
    "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 64,
    "rotary_dim": D_MODEL // N_HEADS // 2,
    "bos_token_id": BOS, "eos_token_id": BOS, "pad_token_id": BOS,
    "tie_word_embeddings": False, "use_cache": True,
}
GQA_FIELDS = ("num_key_value_heads", "multi_query", "new_decoder_architecture")


def registered() -> list[str]:
    """The causal-LM class names TransformerLens's bridge registers that transformers defines."""
    import transformers
    from transformer_lens.factories.architecture_adapter_factory import (
        SUPPORTED_ARCHITECTURES,
    )

    return sorted(a for a in SUPPORTED_ARCHITECTURES
                  if a.endswith(("ForCausalLM", "LMHeadModel")) and hasattr(transformers, a)
                  and not a.startswith(("Bert", "Roberta")))


def _derived(config_cls: type, name: str) -> bool:
    """A config attribute computed from others (a property): not settable."""
    return isinstance(getattr(config_cls, name, None), property)


def tiny_config(arch: str) -> Any:
    """The architecture's transformers config, shrunk (see :data:`TINY`)."""
    import transformers

    cls = getattr(transformers, arch)
    config_cls = cls.config_class
    defaults = config_cls()
    kwargs = {k: v for k, v in TINY.items() if hasattr(defaults, k) and not _derived(config_cls, k)}
    if getattr(defaults, "num_key_value_heads", None) not in (None, 0):
        kwargs["num_key_value_heads"] = N_KV
    for drop in ("layer_types", "sliding_window_pattern"):  # derived from the layer count
        if isinstance(getattr(defaults, drop, None), list) and not _derived(config_cls, drop):
            kwargs[drop] = None
    if arch.startswith("Falcon"):
        kwargs.update(new_decoder_architecture=False, multi_query=True, parallel_attn=True)
    if arch.startswith("Gemma2") or arch.startswith("Gemma3"):
        kwargs.update(query_pre_attn_scalar=16, sliding_window=4)
    config = config_cls(**kwargs)
    for key, value in kwargs.items():  # some configs derive fields after __init__
        if value is not None and hasattr(config, key) and key != "layer_types":
            try:
                setattr(config, key, value)
            except (AttributeError, TypeError, ValueError):
                pass
    config.architectures = [arch]
    return config


def build_model(arch: str, seed: int = 0) -> torch.nn.Module:
    """A random-init tiny model of ``arch`` (eager attention), its unembedding scaled so the
    largest logit before any soft-cap or logit scale is :data:`LOGIT_SIZE`."""
    import transformers

    config = tiny_config(arch)
    torch.manual_seed(seed)
    model = getattr(transformers, arch)._from_config(config, attn_implementation="eager")
    head = model.get_output_embeddings()
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        if bool((emb[BOS] == 0).all()):  # pad_token_id = BOS: a zero row, a dead position 0
            emb[BOS] = torch.randn(emb.shape[1]) * emb[:BOS].std()
        for p in model.parameters():  # init std 0.02 gives tiny attention scores: 5x
            if p.dim() == 2 and p is not head.weight:
                p.mul_(5.0)
        hidden = model(torch.tensor(PROBE), output_hidden_states=True).hidden_states[-1]
        final = model.model.norm if hasattr(getattr(model, "model", None), "norm") else None
        raw = head(final(hidden)) if final is not None else model(torch.tensor(PROBE)).logits
        head.weight.mul_(LOGIT_SIZE / raw.abs().max().clamp_min(1e-6))
    return model.eval()


@dataclass
class Built:
    """A saved tiny model, or why it could not be built."""

    arch: str
    folder: Path | None
    error: str | None = None


def save(arch: str, root: Path) -> Built:
    """Build ``arch`` and save it with the tokenizer under ``root/arch``."""
    folder = root / arch
    try:
        model = build_model(arch)
        model.save_pretrained(folder)
    except Exception as exc:  # noqa: BLE001 - recorded: this architecture cannot be built here
        shutil.rmtree(folder, ignore_errors=True)
        return Built(arch, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TOKENIZER_DIR / name, folder / name)
    (folder / "built.json").write_text(json.dumps({"arch": arch}))
    return Built(arch, folder)
