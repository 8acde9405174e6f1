"""The model: the only package that knows TransformerLens and transformers internals.

- :mod:`~mechsink.model.kinds`: which kind of model this is (bridge, HookedTransformer).
- :mod:`~mechsink.model.adapter`: wrap a transformers model in a TransformerBridge (or take a
  HookedTransformer as it is), describe it, and copy it back out as a plain model.
- :mod:`~mechsink.model.tokens`: tokens with an explicit BOS, checked against vocabulary and
  context.
- :mod:`~mechsink.model.hooks`: hook names, and how a hook edits what it sees.
- :mod:`~mechsink.model.weights`: the weights measurements read (GQA-aware projections and
  biases, the norms' gains), the attention scale, and whether attention has a learned sink
  logit.
- :mod:`~mechsink.model.switches`: TransformerLens's per-head hook switches
  (``use_split_qkv_input`` ...) set for a ``with`` block and restored.
- :mod:`~mechsink.model.probes`: what a model really does (:func:`capabilities`: hooks that
  fire, a forward from a later layer, the unembedding, batch growth), probed once per model.
- :mod:`~mechsink.model.support`: :func:`check_supported`, every entry point's first line: a
  model an entry point cannot run exactly on is refused in one line before any work.
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

from mechsink.lazy import lazy_names

# name -> the module that defines it; imported on first use, so `import mechsink.model.zoo`
# (e.g. for `mechsink models`) does not pull in torch and TransformerLens
_LAZY = {
    "Capabilities": "mechsink.model.probes",
    "PrefixKV": "mechsink.model.kv",
    "act_name": "mechsink.model.hooks",
    "architecture_summary": "mechsink.model.adapter",
    "block_norm": "mechsink.model.weights",
    "attention_scale": "mechsink.model.weights",
    "bos_token_id": "mechsink.model.tokens",
    "capabilities": "mechsink.model.probes",
    "check_metric_supported": "mechsink.model.support",
    "check_seq_len": "mechsink.model.tokens",
    "cache_blocks": "mechsink.model.forward",
    "check_supported": "mechsink.model.support",
    "check_tokens": "mechsink.model.tokens",
    "context_length": "mechsink.model.tokens",
    "down_projection": "mechsink.model.weights",
    "down_projection_bias": "mechsink.model.mlp_out",
    "has_hook": "mechsink.model.hooks",
    "has_learned_sink": "mechsink.model.weights",
    "head_output_weights": "mechsink.model.weights",
    "hf_model_of": "mechsink.model.kinds",
    "hook_names": "mechsink.model.hooks",
    "is_bridge": "mechsink.model.kinds",
    "is_hooked_transformer": "mechsink.model.kinds",
    "key_bias": "mechsink.model.weights",
    "key_weights": "mechsink.model.weights",
    "list_models": "mechsink.model.zoo",
    "moe_experts": "mechsink.model.moe",
    "load_model": "mechsink.model.zoo",
    "n_kv_heads": "mechsink.model.weights",
    "norm_gain_bias": "mechsink.model.weights",
    "norm_params": "mechsink.model.weights",
    "plain_hf_copy": "mechsink.model.adapter",
    "projection_bias": "mechsink.model.weights",
    "post_mlp_norms": "mechsink.model.mlp_out",
    "query_bias": "mechsink.model.weights",
    "run_from_layer": "mechsink.model.forward",
    "run_with_kv": "mechsink.model.forward",
    "save_organism": "mechsink.model.zoo",
    "scale_edits_expected": "mechsink.model.hooks",
    "supports_prefix_reuse": "mechsink.model.kv",
    "tl_get_act_name": "mechsink.model.hooks",
    "to_tokens": "mechsink.model.tokens",
    "token_strings": "mechsink.model.tokens",
    "tokenizer_of": "mechsink.model.tokens",
    "true_act_fn": "mechsink.model.adapter",
    "true_d_mlp": "mechsink.model.adapter",
    "true_dtype": "mechsink.model.adapter",
    "unembed": "mechsink.model.forward",
    "value_weights": "mechsink.model.weights",
    "wrap": "mechsink.model.adapter",
    "wrap_hf": "mechsink.model.adapter",
    "write_in_place": "mechsink.model.hooks",
    # TransformerLens's own (it takes seconds to import): ``mechsink.model.TransformerBridge``
    "TransformerBridge": "transformer_lens.model_bridge",
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

__all__ = [
    "Capabilities", "PrefixKV", "TransformerBridge", "act_name", "architecture_summary",
    "attention_scale", "block_norm", "bos_token_id", "cache_blocks", "capabilities",
    "check_metric_supported", "check_seq_len",
    "check_supported", "check_tokens", "context_length", "down_projection",
    "down_projection_bias", "has_hook", "has_learned_sink", "head_output_weights", "hf_model_of",
    "hook_names", "is_bridge", "is_hooked_transformer", "key_bias", "key_weights", "list_models",
    "load_model", "moe_experts", "n_kv_heads", "norm_gain_bias", "norm_params", "plain_hf_copy",
    "post_mlp_norms", "projection_bias", "query_bias", "run_from_layer", "run_with_kv",
    "save_organism", "scale_edits_expected",
    "supports_prefix_reuse", "tl_get_act_name", "to_tokens", "token_strings", "tokenizer_of",
    "true_act_fn", "true_d_mlp", "true_dtype", "unembed", "value_weights", "wrap", "wrap_hf",
    "write_in_place",
]
