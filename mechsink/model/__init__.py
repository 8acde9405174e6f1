"""The model: the only package that knows TransformerLens and transformers internals.

- :mod:`~mechsink.model.kinds`: which kind of model this is (bridge, HookedTransformer).
- :mod:`~mechsink.model.adapter`: wrap a transformers model in a TransformerBridge (or take a
  HookedTransformer as it is), describe it, and copy it back out as a plain model.
- :mod:`~mechsink.model.tokens`: tokens with an explicit BOS, checked against vocabulary and
  context.
- :mod:`~mechsink.model.hooks`: hook names, and how a hook edits what it sees.
- :mod:`~mechsink.model.weights`: the weights measurements read (GQA-aware) and the attention
  scale.
- :mod:`~mechsink.model.capabilities`: what a model really does (hooks that fire, a forward
  from a later layer, the unembedding), probed once per model.
- :mod:`~mechsink.model.forward` and :mod:`~mechsink.model.kv`: runs from a layer, up to a
  layer, reusing a recorded prefix's keys and values (what the patching engine runs on).
- :mod:`~mechsink.model.patches`: every change to TransformerLens's or transformers' own
  behaviour, one module each, with the versions it targets.
- :mod:`~mechsink.model.zoo`: model names -> loaded models (real GGUF models, random-init
  families, organisms, ``hf:`` folders), with the verified conversion cache.
- :mod:`~mechsink.model.assets`: files taken out of registry packages, hash-checked.
- :mod:`~mechsink.model.variants`: architecture edits that stay hookable (head-wise RMSNorm,
  sink-free attention variants).
- :mod:`~mechsink.model.generate`: greedy continuation through the hookable forward.

Everything outside this package reaches a model through the names exported here.
"""

from typing import Any

from mechsink.model.adapter import (
    architecture_summary,
    plain_hf_copy,
    true_act_fn,
    true_d_mlp,
    true_dtype,
    wrap,
    wrap_hf,
)
from mechsink.model.capabilities import Capabilities, capabilities
from mechsink.model.forward import run_from_layer, run_with_kv, unembed
from mechsink.model.hooks import (
    act_name,
    has_hook,
    hook_names,
    scale_edits_expected,
    tl_get_act_name,
    write_in_place,
)
from mechsink.model.kinds import hf_model_of, is_bridge, is_hooked_transformer
from mechsink.model.kv import PrefixKV, supports_prefix_reuse
from mechsink.model.tokens import (
    bos_token_id,
    check_seq_len,
    check_tokens,
    context_length,
    to_tokens,
    token_strings,
    tokenizer_of,
)
from mechsink.model.weights import (
    attention_scale,
    down_projection,
    head_output_weights,
    key_bias,
    key_weights,
    n_kv_heads,
    norm_params,
    query_bias,
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
    "Capabilities", "PrefixKV", "TransformerBridge", "act_name", "architecture_summary",
    "attention_scale", "bos_token_id", "capabilities", "check_seq_len", "check_tokens",
    "context_length", "down_projection", "has_hook", "head_output_weights", "hf_model_of",
    "hook_names", "is_bridge", "is_hooked_transformer", "key_bias", "key_weights", "list_models",
    "load_model", "n_kv_heads", "norm_params", "plain_hf_copy", "query_bias", "run_from_layer",
    "run_with_kv", "save_organism", "scale_edits_expected", "supports_prefix_reuse",
    "tl_get_act_name", "to_tokens", "token_strings", "tokenizer_of", "true_act_fn", "true_d_mlp",
    "true_dtype", "unembed", "wrap", "wrap_hf", "write_in_place",
]
