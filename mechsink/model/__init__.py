"""The model: the only package that knows TransformerLens and transformers internals.

- :mod:`mechsink.model.bridge`: wrap a transformers model in a TransformerBridge (or take a
  HookedTransformer), tokens with an explicit BOS, weight accessors, and the forward / KV-cache
  machinery the patching engine runs on.
- :mod:`mechsink.model.zoo`: model names -> loaded models (real GGUF models, random-init
  families, organisms, ``hf:`` folders), with the verified conversion cache.
- :mod:`mechsink.model.assets`: files taken out of registry packages, hash-checked.
- :mod:`mechsink.model.variants`: architecture edits that stay hookable (head-wise RMSNorm,
  sink-free attention variants).
- :mod:`mechsink.model.generate`: greedy continuation through the hookable forward.

Everything outside this package reaches a model through the names exported here.
"""

from typing import Any

from mechsink.model.bridge import (
    PrefixKV,
    act_name,
    architecture_summary,
    bos_token_id,
    check_seq_len,
    check_tokens,
    context_length,
    down_projection,
    has_hook,
    head_output_weights,
    hf_model_of,
    hook_names,
    is_bridge,
    is_hooked_transformer,
    key_bias,
    key_weights,
    n_kv_heads,
    norm_params,
    plain_hf_copy,
    query_bias,
    run_from_layer,
    run_with_kv,
    scale_edits_expected,
    supports_prefix_reuse,
    to_tokens,
    token_strings,
    tokenizer_of,
    unembed,
    wrap,
    wrap_hf,
    write_in_place,
)
from mechsink.model.zoo import list_models, load_model, save_organism


def __getattr__(name: str) -> Any:
    """TransformerLens is imported lazily (it takes seconds):
    ``mechsink.model.TransformerBridge``."""
    if name == "TransformerBridge":
        from transformer_lens.model_bridge import TransformerBridge

        return TransformerBridge
    raise AttributeError(f"module 'mechsink.model' has no attribute {name!r}")


__all__ = [
    "PrefixKV", "TransformerBridge", "act_name", "architecture_summary", "bos_token_id",
    "check_seq_len", "check_tokens", "context_length", "down_projection", "has_hook",
    "head_output_weights", "hf_model_of", "hook_names", "is_bridge", "is_hooked_transformer",
    "key_bias", "key_weights", "list_models", "load_model", "n_kv_heads", "norm_params",
    "plain_hf_copy", "query_bias", "run_from_layer", "run_with_kv", "save_organism",
    "scale_edits_expected", "supports_prefix_reuse", "to_tokens", "token_strings",
    "tokenizer_of", "unembed", "wrap", "wrap_hf", "write_in_place",
]
