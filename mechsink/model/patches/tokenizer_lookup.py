"""Stop the bridge from loading a tokenizer by the model's name when none was given.

Targets: transformer-lens 4.3 (``transformer_lens.model_bridge.sources.transformers.source``,
whose ``boot`` calls the module-level ``skip_tokenizer_for_modality(cfg)`` and, when it says
False, ``AutoTokenizer.from_pretrained(model_name)``). Other layouts are left alone (the
offline switch still keeps them local).
Why: ``wrap_hf(model, None, name=...)`` must give a bridge without a tokenizer (token ids
only); the name is a label, and a lookup by it is a hub request (or a wrong local tokenizer).
Remove when: ``boot_transformers`` has a way to say "no tokenizer".
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

TARGETS = {"transformer-lens": ">=4.3,<5"}


@contextmanager
def no_tokenizer_lookup() -> Iterator[None]:
    """Inside, TransformerBridge.boot_transformers builds a bridge without a tokenizer instead
    of looking one up by the model's name (restored on exit)."""
    try:
        from transformer_lens.model_bridge.sources.transformers import source
    except ImportError:  # other TransformerLens layouts: offline() still keeps it local
        yield
        return
    original = getattr(source, "skip_tokenizer_for_modality", None)
    if original is None:
        yield
        return
    source.skip_tokenizer_for_modality = lambda cfg: True
    try:
        yield
    finally:
        source.skip_tokenizer_for_modality = original
