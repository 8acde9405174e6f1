"""Skip the blocks before ``start_at_layer`` instead of running and discarding them.

Targets: transformer-lens 4.3 (``TransformerBridge.forward(..., start_at_layer=L)`` runs the
wrapped transformers model whole and lets block ``L`` swap in the caller's residual, so blocks
``0..L-1`` still execute) over transformers 4.57 to 5.x decoders, which iterate over one
``nn.ModuleList`` and, for models that mix layer kinds (Gemma 3's sliding-window and global
layers), pick each layer's mask and rotary embedding by ``config.layer_types[index]``.
Why: the patching engine runs from every layer many times; running the earlier blocks for
nothing makes a forward from layer ``L`` cost a full forward. The list is cut for the call
only, with ``layer_types`` shifted alongside; the tests check that a forward from a layer
equals the full forward (Gemma 3 included).
Remove when: the bridge's ``start_at_layer`` skips the earlier blocks itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

from mechsink.errors import BadInputError
from mechsink.model.adapter import hf_model_of

TARGETS = {"transformer-lens": ">=4.3,<5", "transformers": ">=4.57,<6"}


def _decoder_layer_list(model: Any) -> tuple[nn.Module, str] | None:
    """The (parent, attribute) of the transformers ModuleList that holds the model's blocks.

    The bridge's ``blocks[i]`` are the very modules the wrapped transformers model iterates
    over, so we look for the ModuleList whose first entry is ``blocks[0]``. None for models
    that are not bridges (a HookedTransformer skips earlier blocks by itself).
    """
    try:
        hf = hf_model_of(model)
    except BadInputError:
        return None
    first = model.blocks[0]
    for name, module in hf.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and module[0] is first:
            parent_name, _, attr = name.rpartition(".")
            return (hf.get_submodule(parent_name) if parent_name else hf), attr
    return None


@contextmanager
def only_blocks_from(model: Any, start: int) -> Iterator[None]:
    """Make the wrapped model iterate over blocks ``start..`` only (restored on exit).

    TransformerBridge's ``start_at_layer`` still executes blocks ``0..start-1`` and discards
    their output; dropping them from the layer list for the duration of the call skips that
    work. Exactness is checked by the tests (start-at-layer forward == full forward).
    """
    found = _decoder_layer_list(model) if start > 0 else None
    if found is None:
        yield
        return
    parent, attr = found
    full = getattr(parent, attr)
    # models that mix layer kinds (Gemma's sliding-window and global layers) pick each layer's
    # mask and rotary embedding by its index in the list: shift the kinds along with it
    config = getattr(parent, "config", None)
    kinds = getattr(config, "layer_types", None)
    shift_kinds = isinstance(kinds, list) and len(kinds) == len(full)
    setattr(parent, attr, nn.ModuleList(list(full)[start:]))
    if shift_kinds:
        config.layer_types = kinds[start:]
    try:
        yield
    finally:
        setattr(parent, attr, full)
        if shift_kinds:
            config.layer_types = kinds
