"""Tokenisation with an explicit BOS choice, and the architecture summary."""

from __future__ import annotations

import pytest

from mechsink.bridge import architecture_summary, to_tokens
from mechsink.errors import BadInputError


def test_prepend_bos_is_explicit(gpt2_tiny):
    with_bos = to_tokens(gpt2_tiny, "Hello world", prepend_bos=True)
    without = to_tokens(gpt2_tiny, "Hello world", prepend_bos=False)
    assert with_bos[0, 0].item() == 50256
    assert with_bos[0, 1:].tolist() == without[0].tolist() == [15496, 995]


def test_seq_len_cuts_and_short_texts_fail(gpt2_tiny):
    tokens = to_tokens(gpt2_tiny, ["one two three four", "five six seven eight"],
                       prepend_bos=False, seq_len=3)
    assert tokens.shape == (2, 3)
    with pytest.raises(BadInputError, match="fewer than seq_len"):
        to_tokens(gpt2_tiny, ["one", "five six seven eight"], prepend_bos=False, seq_len=3)


def test_uneven_texts_need_seq_len(gpt2_tiny):
    with pytest.raises(BadInputError, match="seq_len"):
        to_tokens(gpt2_tiny, ["one", "one two three"], prepend_bos=False)


def test_too_long_for_context_is_an_error(gpt2_tiny):
    with pytest.raises(BadInputError, match="context"):
        to_tokens(gpt2_tiny, "word " * 400, prepend_bos=False)


def test_architecture_summary(llama_tiny):
    summary = architecture_summary(llama_tiny)
    assert summary["architecture"] == "LlamaForCausalLM"
    assert (summary["n_layers"], summary["n_heads"], summary["n_kv_heads"]) == (2, 4, 2)
    assert summary["positional_embedding"] == "rotary"
    assert summary["n_params"] > 3_000_000
