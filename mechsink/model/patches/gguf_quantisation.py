"""Forget the GGUF "quantisation" of a model transformers has decoded from a GGUF file.

Targets: transformers 5.x (``from_pretrained(..., gguf_file=...)`` dequantises the weights to
the float dtype asked for, yet leaves the model marked as quantised: ``config``'s
``quantization_config``, ``model.hf_quantizer`` and ``model.is_quantized``).
Why: the zoo saves the decoded model as plain safetensors (:mod:`mechsink.model.zoo.gguf`);
with the marks left on, the saved folder claims a quantisation its float weights do not
have, and saving goes through the quantiser's path.
Remove when: transformers drops the marks once it has dequantised.
"""

from __future__ import annotations

from torch import nn

TARGETS = {"transformers": ">=5,<6"}


def drop_gguf_quantisation(model: nn.Module) -> None:
    """The weights are already dequantised to float; forget the GGUF 'quantisation' so they save."""
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    if getattr(model, "is_quantized", False):
        model.is_quantized = False
