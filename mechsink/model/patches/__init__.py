"""Every change mechsink makes to TransformerLens's or transformers' own behaviour, one module
each, each naming the library versions it was written against (``TARGETS``, checked against
the installed ones by the tests), why it is needed and when it can go:

- :mod:`~mechsink.model.patches.offline`: the model hub switched off while a model in memory is
  wrapped.
- :mod:`~mechsink.model.patches.tokenizer_lookup`: no tokenizer looked up by the model's name.
- :mod:`~mechsink.model.patches.variant_attention`: a Llama attention forward whose softmax is
  an attention variant's pattern (transformers side).
- :mod:`~mechsink.model.patches.variant_patterns`: the bridge's softmax replaced by the
  variant's pattern (TransformerLens side).
- :mod:`~mechsink.model.patches.skip_blocks`: a forward from a layer skips the blocks before
  it.
- :mod:`~mechsink.model.patches.growing_batch`: attention masks that follow a batch growing
  mid-forward.
- :mod:`~mechsink.model.patches.cache_keyword`: the bridge's attention reads the transformers
  cache under its transformers 5 keyword.
- :mod:`~mechsink.model.patches.fast_blocks`: a block with no hooks runs as its plain
  transformers layer (inside ``fast_blocks(model)``; not on by default).
- :mod:`~mechsink.model.patches.attention_hooks`: the declared attention hooks fire inside
  the computation where the bridge never calls them: ``hook_rot_q/k`` (GPT-NeoX, GPT-J,
  Falcon, Phi-3, ...), and ``hook_attn_scores``/``hook_pattern`` on bridges that run
  transformers' attention (GPT-J, OPT, XGLM, Llama 4, ...), whose edits were discarded.
- :mod:`~mechsink.model.patches.list_outputs`: a block's ``hook_resid_post`` fires when the
  transformers block returns a list (GPT-1), where it never fired.
- :mod:`~mechsink.model.patches.rotary_dtype`: rotated queries and keys cast back to a
  half-precision model's dtype, as transformers does (the OLMo family failed in bfloat16).
- :mod:`~mechsink.model.patches.gguf_quantisation`: a model decoded from GGUF no longer
  marked as quantised.
- :mod:`~mechsink.model.patches.alibi_qkv_fork`: MPT's attention forks its input per head
  under ``use_split_qkv_input`` (edits of ``hook_q/k/v_input`` were dropped).
- :mod:`~mechsink.model.patches.bloom_block_inputs`: Bloom's ``hook_q/k/v_input`` hold the
  residual stream (they held the normalised input) and its ``hook_mlp_in`` fires.

Each patch is undone on exit where it is a context manager; the others change only an object
mechsink built (a wrapped model's modules, a freshly decoded model).
"""
