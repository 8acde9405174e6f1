"""Which kind of model this is: a TransformerLens bridge, a HookedTransformer, or neither.

mechsink accepts a ``TransformerBridge`` (TransformerLens 4.x, what :func:`mechsink.load_model`
returns) and a ``HookedTransformer`` (TransformerLens 2.x and 3.x); everything that differs
between the two is decided by the checks here, made without importing TransformerLens.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from mechsink.errors import BadInputError
from mechsink.model.versions import tl_major


def _class_names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def is_hooked_transformer(model: Any) -> bool:
    """True for a TransformerLens ``HookedTransformer`` (2.x/3.x), checked without importing
    TransformerLens."""
    return "HookedTransformer" in _class_names(model)


def is_bridge(model: Any) -> bool:
    """True for a TransformerLens ``TransformerBridge``."""
    return "TransformerBridge" in _class_names(model)


def is_hf_causal_lm(model: Any) -> bool:
    """True for a transformers ``PreTrainedModel`` with a language-model head."""
    names = _class_names(model)
    return "PreTrainedModel" in names and any(
        n.endswith(("ForCausalLM", "LMHeadModel")) for n in names)


def hf_model_of(model: Any) -> nn.Module:
    """The plain transformers model behind a bridge (for parity checks and saving)."""
    original = model.__dict__.get("original_model") if hasattr(model, "__dict__") else None
    if original is None:
        original = getattr(model, "original_model", None)
    if original is None:
        raise BadInputError(
            f"{type(model).__name__} does not wrap a transformers model; "
            "load it with mechsink.load_model(...) to get a TransformerBridge."
        )
    return original


def starts_at_layer(model: Any) -> bool:
    """Whether ``model(resid, start_at_layer=L)`` works: always on a HookedTransformer; on a
    TransformerBridge from TransformerLens 4 on (3.x bridges raise NotImplementedError)."""
    return not is_bridge(model) or tl_major() >= 4


def plain_module(module: Any) -> Any:
    """The transformers module under a bridge component (the module itself when it is one):
    calling it fires no hook, and its parameters are the model's own."""
    return getattr(module, "_original_component", None) or module
