"""References for the zoo's parity tests: a plain transformers model's logits and every decoder
layer's input and output (read by torch hooks), and transformers' own load of a GGUF file."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


def decoder_residuals(hf_model, tokens) -> tuple[torch.Tensor, list[tuple[str, torch.Tensor]]]:
    """Logits and ("in" | "out", hidden state) of every decoder layer, in order."""
    layers = hf_model.transformer.h if hasattr(hf_model, "transformer") else hf_model.model.layers
    seen: list[tuple[str, torch.Tensor]] = []

    def grab_in(module, args, kwargs):
        seen.append(("in", (args[0] if args else kwargs["hidden_states"]).detach().clone()))

    def grab_out(module, args, output):
        seen.append(("out", (output[0] if isinstance(output, tuple) else output).detach().clone()))

    with torch_hooks(*(h for layer in layers for h in (
            layer.register_forward_pre_hook(grab_in, with_kwargs=True),
            layer.register_forward_hook(grab_out)))), torch.no_grad():
        logits = hf_model(tokens).logits
    return logits, seen


@contextmanager
def torch_hooks(*handles: Any) -> Iterator[None]:
    """Keep the given torch hook handles for the ``with`` body and remove them after, also when
    the body raises: the plain transformers model is left as it was."""
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def transformers_gguf_load(gguf: Path):
    """transformers reading the GGUF file itself (float32, eager attention): the independent
    reference for a zoo conversion."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
