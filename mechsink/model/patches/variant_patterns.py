"""Give the bridge's attention the softmax of a mechsink attention variant.

Targets: transformer-lens 4.3 (the attention bridges' ``_masked_softmax(scores, dtype=...)``
in ``transformer_lens.model_bridge.generalized_components.attention`` and its subclasses: the
weights ``hook_pattern`` sees and the values are multiplied by).
Why: in compatibility mode the bridge recomputes attention itself instead of calling the
transformers module, so a variant that replaced the transformers forward
(:mod:`mechsink.model.patches.variant_attention`) would be bypassed; replacing the bridge's
softmax on the instance keeps ``hook_attn_scores``, ``hook_pattern`` and ``hook_z`` meaning
what they mean for softmax attention.
Remove when: the bridge calls a pattern function the wrapped module provides.
"""

from __future__ import annotations

from typing import Any

from mechsink.model.variants import variant_pattern_fn

TARGETS = {"transformer-lens": ">=4.3,<5"}


def use_variant_patterns(bridge: Any) -> None:
    """Attention variants (mechsink.model.variants) replace the softmax over keys: the bridge's own
    softmax, whose output hook_pattern sees and the values are weighted by, becomes theirs."""
    for module in bridge.modules():
        if not hasattr(module, "_masked_softmax"):
            continue
        fn = variant_pattern_fn(getattr(module, "original_component", None))
        if fn is not None:
            module._masked_softmax = fn
