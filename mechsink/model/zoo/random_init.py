"""``random:<family>-<size>``: a transformers architecture at a named size, freshly initialised.

Each family is one entry of :data:`FAMILIES` (its config class, sizes and shared settings);
every family uses GPT-2's BPE tokenizer and vocabulary, and the seed alone picks the weights.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported when a model is built, not to list the names
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
    import torch
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)


VOCAB = 50257  # GPT-2's BPE vocabulary, shared by every family


def random_n_params(spec: str) -> int:
    """The parameter count of ``random:<spec>`` from its sizes alone (no transformers, no torch:
    ``mechsink models`` lists them in milliseconds). GPT-2: tied embeddings, biases everywhere,
    MLP 4 x d; Llama: untied, no biases, grouped K/V, gated MLP, RMSNorm weights only."""
    m = _RANDOM_RE.match(spec)
    if m is None or m.group(2) not in FAMILIES[m.group(1)].sizes:
        random_config(spec)  # raises the one-line error for the malformed name
    family, size = m.group(1), m.group(2)  # type: ignore[union-attr]
    z = {**FAMILIES[family].sizes[size], **FAMILIES[family].shared}
    if family == "gpt2":
        d, n_layer, n_pos = z["n_embd"], z["n_layer"], z["n_positions"]
        block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + \
            (4 * d * d + d)
        return VOCAB * d + n_pos * d + n_layer * block + 2 * d
    if family == "llama":
        d, n_layer, inter = z["hidden_size"], z["num_hidden_layers"], z["intermediate_size"]
        kv = z["num_key_value_heads"] * (d // z["num_attention_heads"])
        block = 2 * d * d + 2 * d * kv + 3 * d * inter + 2 * d
        tied = z.get("tie_word_embeddings", False)
        return VOCAB * d * (1 if tied else 2) + n_layer * block + d
    raise NotImplementedError(f"no parameter formula for the {family} family")  # pragma: no cover
