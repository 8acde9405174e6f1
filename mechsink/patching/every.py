"""TransformerLens's ``get_act_patch_block_every`` in one call: the residual entering each
block, each attention output and each MLP output, patched per layer and position.

Same layout as TransformerLens (``[3, layer, pos]``, components in the order resid_pre,
attn_out, mlp_out), so ``result.values`` compares directly with
``transformer_lens.patching.get_act_patch_block_every``; each sweep is mechsink's exact,
batched :func:`~mechsink.patching.activation_patch`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.patching.activation import activation_patch
from mechsink.patching.engine import TokensLike
from mechsink.patching.metrics import Metric
from mechsink.patching.result import PatchResult

#: the components of :func:`block_every`, in TransformerLens's order
BLOCK_COMPONENTS = ("resid_pre", "attn_out", "mlp_out")


def block_every(
    model: Any,
    clean: TokensLike,
    corrupted: TokensLike,
    metric: Metric | Callable[[Tensor], Tensor] | str,
    **kwargs: Any,
) -> PatchResult:
    """Patch ``resid_pre``, ``attn_out`` and ``mlp_out`` at every layer and position; one
    :class:`PatchResult` with axes ``(component, layer, position)``, values ``[3, layer, pos]``
    as TransformerLens's ``get_act_patch_block_every`` (which takes the corrupted tokens and
    the clean cache; here both inputs). ``kwargs`` go to :func:`activation_patch`
    (``direction``, ``normalize``, ``batch_size``, ``prepend_bos``, ...)."""
    if isinstance(metric, (list, tuple)):
        raise BadInputError("block_every takes one metric (call it once per metric).")
    if "site" in kwargs:
        raise BadInputError("block_every patches resid_pre, attn_out and mlp_out: no site=.")
    parts = [activation_patch(model, clean, corrupted, site, metric, **kwargs)
             for site in BLOCK_COMPONENTS]
    first = parts[0]
    assert isinstance(first, PatchResult)
    values = torch.stack([p.values for p in parts])  # type: ignore[union-attr]
    return PatchResult(
        values=values, axes=("component", *first.axes),
        labels={"component": list(BLOCK_COMPONENTS), **first.labels},
        site="block_every", metric=first.metric, clean_value=first.clean_value,
        corrupted_value=first.corrupted_value, tokens=list(first.tokens),
        meta={**first.meta, "components": list(BLOCK_COMPONENTS)},
    )
