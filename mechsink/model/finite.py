"""Refuse weights that are not finite, before any measurement.

One ``inf`` or ``NaN`` in a weight does not crash a forward pass: TransformerLens turns a NaN
attention pattern into zeros, so a scan reports plausible sink scores of ``0.0`` for a head
that computed nothing. :func:`check_finite_weights` makes one pass over the parameters (no
copies: each tensor is checked in place, in chunks, so the scratch memory stays small even for
a large embedding) and raises :class:`NonFiniteWeightsError` naming the first bad tensor.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from mechsink.errors import MechsinkError

_CHUNK = 1 << 24  # elements checked at a time (a 16 MB boolean scratch at most)


class NonFiniteWeightsError(MechsinkError):
    """A model weight holds ``inf`` or ``NaN`` values: every measurement on it would be wrong."""


def _named_weights(model: Any) -> list[tuple[str, Tensor]]:
    """The parameters under the names people know: a TransformerBridge rewires its
    transformers model in place (``._original_component`` aliases, q/k/v views of a fused
    weight), so its tensors are listed under the plain transformers model's own names."""
    from mechsink.model.kinds import hf_model_of, is_bridge

    if not is_bridge(model):
        return list(model.named_parameters()) if isinstance(model, nn.Module) else []
    wrapped = hf_model_of(model)
    tensors: dict[str, Tensor] = {}
    for key, value in wrapped.state_dict(keep_vars=True).items():
        tensors.setdefault(key.replace("._original_component", ""), value)
    try:
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(wrapped.config)
        names = [n for n, _ in plain.named_parameters() if n in tensors]
    except Exception:  # a model transformers cannot rebuild: the bridge's own names
        names = []
    if not names:
        return [(n.replace("._original_component", ""), p) for n, p in wrapped.named_parameters()]
    return [(n, tensors[n]) for n in names]


def _is_finite(p: Tensor) -> bool:
    flat = p.detach().reshape(-1)
    return all(bool(torch.isfinite(chunk).all()) for chunk in flat.split(_CHUNK))


def _n_bad(p: Tensor) -> int:
    flat = p.detach().reshape(-1)
    return sum(int((~torch.isfinite(chunk)).sum()) for chunk in flat.split(_CHUNK))


def first_non_finite(model: Any) -> tuple[str, int, int] | None:
    """``(name, bad values, total values)`` of the first parameter holding ``inf``/``NaN``
    (transformers names for a bridge or a transformers model), or None when all are finite."""
    for name, p in _named_weights(model):
        if (p.is_floating_point() or p.is_complex()) and not _is_finite(p):
            return name, _n_bad(p), p.numel()
    return None


def check_finite_weights(model: Any, *, label: str | None = None) -> None:
    """Raise :class:`NonFiniteWeightsError` (one line) unless every parameter is finite.

    ``label`` names the model in the message (a zoo name or a folder). Anything that is not a
    torch module is left alone (the caller says what it accepts).
    """
    found = first_non_finite(model)
    if found is None:
        return
    name, bad, total = found
    where = f" of {label}" if label else ""
    raise NonFiniteWeightsError(
        f"weight {name}{where} holds {bad} non-finite value(s) (inf or NaN) out of {total}: "
        "every measurement on this model would be wrong; fix or retrain the weights "
        "(a diverged training run, or a damaged file)."
    )
