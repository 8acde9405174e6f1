"""Make a block's ``hook_out`` (``hook_resid_post``) fire when the transformers block returns a
list.

Targets: transformer-lens 4.3 (``BlockBridge._apply_output_hook`` hooks the first element of a
tuple or a bare tensor and returns anything else untouched) and transformers 5
(``OpenAIGPTLMHeadModel``'s ``Block.forward`` returns ``[hidden_states] + attn_outputs[1:]``,
a list, and TransformerLens's GPT-1 attention bridge keeps lists for it).
Why: on GPT-1 ``blocks.<l>.hook_resid_post`` never fired: the last block's output (what the
unembedding reads: ``LogitDiff``, :func:`mechsink.model.unembed`) and every census measurement
of the residual after a block (norm ratios, massive activations) found nothing.
Remove when: ``BlockBridge._apply_output_hook`` hooks the first element of a list too (the
architecture suite's OpenAI-GPT ``unembed`` check then passes without
:func:`install_list_output_hooks`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor

TARGETS = {"transformer-lens": ">=4.3,<5", "transformers": ">=5,<6"}

_WRAPPED = "_mechsink_list_outputs"


def _hook_lists(apply: Callable[..., Any]) -> Callable[..., Any]:
    """The block's own output hook, given a list as the tuple it handles and returning a list
    again (the transformers model indexes it)."""

    def apply_output_hook(output: Any, *args: Any, **kwargs: Any) -> Any:
        if not (isinstance(output, list) and output and isinstance(output[0], Tensor)):
            return apply(output, *args, **kwargs)
        hooked = apply(tuple(output), *args, **kwargs)
        return list(hooked) if isinstance(hooked, tuple) else [hooked]

    setattr(apply_output_hook, _WRAPPED, True)
    return apply_output_hook


def install_list_output_hooks(bridge: Any) -> list[str]:
    """Make every block of ``bridge`` whose transformers layer returns a list fire its
    ``hook_out``; returns the names of the blocks changed (idempotent; only GPT-1's blocks
    are changed, found by their transformers layer's class)."""
    changed = []
    for i, block in enumerate(getattr(bridge, "blocks", [])):
        layer = getattr(block, "original_component", None)
        apply = getattr(block, "_apply_output_hook", None)
        if apply is None or getattr(apply, _WRAPPED, False) or not _returns_list(layer):
            continue
        object.__setattr__(block, "_apply_output_hook", _hook_lists(apply))
        changed.append(f"blocks.{i}")
    return changed


#: transformers decoder layers known to return a list (their ``forward`` builds one)
LIST_LAYERS = {("transformers.models.openai.modeling_openai", "Block")}


def _returns_list(layer: Any) -> bool:
    return layer is not None and (type(layer).__module__, type(layer).__name__) in LIST_LAYERS
