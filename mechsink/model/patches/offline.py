"""Switch the model hub off while a model already in memory is wrapped.

Targets: huggingface-hub 0.36 to 2.x (``huggingface_hub.constants.HF_HUB_OFFLINE``, read by the
hub's download functions at call time) as used by transformers 4.57 to 5.x.
Why: ``TransformerBridge.boot_transformers`` may look files up by the model's name (config,
tokenizer, processor); for a model the caller holds, that name is only a label, and an
online lookup costs tens of seconds of retries on a machine without network, then fails. The
environment variable alone is not enough: huggingface_hub reads it once, at import.
Remove when: the bridge takes an in-memory model without any lookup by name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

TARGETS = {"huggingface-hub": ">=0.36,<3"}


@contextmanager
def offline() -> Iterator[None]:
    """No model-hub access inside (the hub libraries' offline switch, restored on exit):
    wrapping a model that is already in memory must never reach for the network."""
    modules = []
    try:
        import huggingface_hub.constants as hub_constants

        modules.append(hub_constants)
    except ImportError:  # pragma: no cover - transformers always brings it
        pass
    saved_env = os.environ.get("HF_HUB_OFFLINE")
    saved = [(m, getattr(m, "HF_HUB_OFFLINE", None)) for m in modules]
    os.environ["HF_HUB_OFFLINE"] = "1"
    for m in modules:
        m.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for m, value in saved:
            m.HF_HUB_OFFLINE = value
        if saved_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved_env
