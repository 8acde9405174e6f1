"""``random:<family>-<size>``: a transformers architecture at a named size, freshly initialised.

Each family is one entry of :data:`FAMILIES` (its config class, sizes and shared settings);
every family uses GPT-2's BPE tokenizer and vocabulary, and the seed alone picks the weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mechsink.errors import UnknownModelError
from mechsink.model.zoo.tokenizer import GPT2_EOT, gpt2_tokenizer


@dataclass(frozen=True)
class Family:
    """A transformers architecture that ``random:<family>-<size>`` builds with its own init."""

    label: str  # how the name patterns' help calls it
    config_class: str  # the transformers config class
    sizes: dict[str, dict[str, int]]
    shared: dict[str, Any] = field(default_factory=dict)  # config arguments of every size


FAMILIES: dict[str, Family] = {
    "gpt2": Family("GPT-2 family", "GPT2Config", {
        "tiny": dict(n_layer=2, n_embd=64, n_head=4, n_positions=256),
        "mini": dict(n_layer=4, n_embd=256, n_head=4, n_positions=512),
        "small": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024),
    }),
    "llama": Family("Llama family", "LlamaConfig", {
        "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=176, max_position_embeddings=256),
        "mini": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4,
                     num_key_value_heads=2, intermediate_size=688, max_position_embeddings=512),
        "small": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                      num_key_value_heads=4, intermediate_size=2048,
                      max_position_embeddings=2048),
    }, shared=dict(tie_word_embeddings=False)),
}
_RANDOM_RE = re.compile(rf"^({'|'.join(map(re.escape, FAMILIES))})-([a-z0-9]+)$")


def random_names() -> list[str]:
    """Every ``random:<family>-<size>`` name."""
    return [f"random:{f}-{s}" for f, family in FAMILIES.items() for s in family.sizes]


def random_config(spec: str) -> Any:
    """The transformers config of ``random:<spec>`` (``gpt2-tiny``, ``llama-small``, ...)."""
    import transformers

    m = _RANDOM_RE.match(spec)
    if m is None:
        patterns = " or ".join(f"random:{f}-<size>" for f in FAMILIES)
        sizes = " or ".join(f"{', '.join(fam.sizes)} ({f})" for f, fam in FAMILIES.items())
        raise UnknownModelError(
            f"malformed random model {spec!r}: write {patterns} with size one of {sizes}."
        )
    name, size = m.groups()
    family = FAMILIES[name]
    if size not in family.sizes:
        raise UnknownModelError(f"unknown size {size!r} for random:{name}-<size>: choose one of "
                                f"{', '.join(family.sizes)}.")
    common = dict(vocab_size=50257, bos_token_id=GPT2_EOT, eos_token_id=GPT2_EOT)
    config_class = getattr(transformers, family.config_class)
    return config_class(**family.sizes[size], **common, **family.shared)


def random_hf_model(spec: str, *, seed: int) -> tuple[nn.Module, Any]:
    """A freshly initialised transformers model (the family's own init) and the GPT-2 BPE.

    The global torch RNG is left as it was; the same seed always gives the same weights.
    """
    return seeded_model(random_config(spec), seed).eval(), gpt2_tokenizer()


def seeded_model(config: Any, seed: int, attn_implementation: str = "eager") -> nn.Module:
    """Build a transformers model from ``config`` with the family's own init, from ``seed``."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
