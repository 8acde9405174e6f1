"""Let the bridge's attention find the transformers cache under either keyword.

Targets: transformer-lens 4.3 (the attention bridges' ``_update_kv_cache(k, v, **kwargs)``
reads ``past_key_values=`` or ``layer_past=`` only) with transformers 5.x, whose decoder
layers hand the cache to attention as ``cache=`` (the old keyword is deprecated until 5.40).
Why: without it the bridge's attention neither records nor reads cached keys and values, so
prefix reuse (:mod:`mechsink.model.kv`) would be lost. The wrapper is an instance attribute,
removed on exit, so the class is never touched.
Remove when: TransformerLens reads ``cache=``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import Tensor

TARGETS = {"transformer-lens": ">=4.3,<5", "transformers": ">=5,<6"}


@contextmanager
def attention_reads_cache(model: Any) -> Iterator[None]:
    """Let the bridge's attention find the transformers cache under either keyword.

    transformers 5 hands the cache to attention as ``cache=``; TransformerLens 4.3's attention
    components look for ``past_key_values=`` only, so without this they would neither record
    nor read cached keys and values.
    """
    attns = [b.attn for b in model.blocks]
    for attn in attns:
        original = attn._update_kv_cache

        def update(k: Tensor, v: Tensor, _original: Any = original, **kw: Any) -> Any:
            if kw.get("past_key_values") is None and kw.get("cache") is not None:
                kw["past_key_values"] = kw["cache"]
            return _original(k, v, **kw)

        attn._update_kv_cache = update
    try:
        yield
    finally:
        for attn in attns:
            attn.__dict__.pop("_update_kv_cache", None)
