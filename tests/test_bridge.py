"""Tokenisation with an explicit BOS choice, and the architecture summary."""

from __future__ import annotations

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.model import architecture_summary, to_tokens


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


@pytest.mark.parametrize("name", ["gpt2_tiny", "llama_tiny"])
def test_prefix_run_equals_the_full_forward(request, name):
    """Positions p.. from block L, keys/values of positions < p read from the recorded run,
    give the full forward's logits and patterns at those positions (absolute positions and
    rotary, GQA)."""
    import torch

    from mechsink.model import act_name, run_from_layer, run_with_kv

    model = request.getfixturevalue(name)
    tokens = to_tokens(model, ["When Mary and John went to the", "The cat sat on the mat in"],
                       prepend_bos=True, seq_len=7)
    names = {act_name("resid_pre", 1), act_name("pattern", 1)}
    logits, acts, kv = run_with_kv(model, tokens, names)
    assert kv is not None and kv.keys[0].shape[2] == 7
    for start, first in [(0, 1), (1, 3), (1, 6)]:
        resid = run_with_kv(model, tokens, {act_name("resid_pre", start)})[1][
            act_name("resid_pre", start)]
        seen: dict = {}

        def keep(a, hook, seen=seen):
            seen["p"] = a

        hook = (act_name("pattern", 1), keep)
        stacked = resid[:, first:].repeat(2, 1, 1)
        with torch.no_grad():
            out = run_from_layer(model, stacked, start, fwd_hooks=[hook], prefix=(kv, first))
        assert (out - logits[:, first:].repeat(2, 1, 1)).abs().max() <= 1e-5
        expected = acts[act_name("pattern", 1)][:, :, first:].repeat(2, 1, 1, 1)
        assert (seen["p"] - expected).abs().max() <= 1e-6


def test_check_tokens(gpt2_tiny):
    import torch

    from mechsink.model import check_tokens

    check_tokens(gpt2_tiny, torch.tensor([[0, 50256]]))
    with pytest.raises(BadInputError, match="token id 50257 is outside"):
        check_tokens(gpt2_tiny, torch.tensor([[0, 50257]]))
    with pytest.raises(BadInputError, match="integer ids"):
        check_tokens(gpt2_tiny, torch.tensor([[0.0, 1.0]]))


@pytest.mark.slow
def test_prefix_run_on_gemma_sliding_and_global_layers():
    """Gemma 3 mixes sliding-window and global layers (own masks and rotary bases): a run
    from block 1 (and from block 7) at positions 3.. equals the full forward."""
    import torch

    from mechsink import load_model
    from mechsink.model import act_name, run_from_layer, run_with_kv

    model = load_model("gemma3-270m", device="cpu")
    tokens = to_tokens(model, ["When Mary and John went to the store, John", "The cat sat on "
                               "the mat in the sun and then it"], prepend_bos=True, seq_len=10)
    names = {act_name("resid_pre", 1), act_name("resid_pre", 7)}
    logits, acts, kv = run_with_kv(model, tokens, names)
    assert kv is not None
    for start in (1, 7):
        with torch.no_grad():
            plain = run_from_layer(model, acts[act_name("resid_pre", start)], start)
            out = run_from_layer(model, acts[act_name("resid_pre", start)][:, 3:], start,
                                 prefix=(kv, 3))
        assert (plain - logits).abs().max() <= 1e-4
        assert (out - logits[:, 3:]).abs().max() <= 1e-4


# --- mechsink.wrap: a model the user holds, first-class --------------------------------------


def test_wrap_takes_a_transformers_model_and_keeps_its_numbers():
    """wrap() of a transformers causal LM gives a bridge whose logits are the plain model's, and
    that the patching and census entry points accept."""
    import mechsink
    from mechsink.model.zoo import random_hf_model
    from mechsink.patching import SinkScore, activation_patch

    hf, tok = random_hf_model("llama-tiny", seed=3)
    tokens = torch.randint(0, 50000, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(tokens).logits
    model = mechsink.wrap(hf, tok)
    with torch.no_grad():
        assert (model(tokens) - want).abs().max().item() < 1e-4
    assert mechsink.wrap(model) is model  # an existing bridge comes back as it is
    result = activation_patch(model, tokens[:1], tokens[1:], "resid_pre", SinkScore(1, 0),
                              prepend_bos=False)
    assert result.values.shape == (2, 9)


def test_wrap_refuses_what_is_not_a_model():
    import mechsink

    with pytest.raises(TypeError, match="HookedTransformer") as info:
        mechsink.wrap(torch.nn.Linear(2, 2))
    assert "transformers causal language model" in str(info.value)
    with pytest.raises(TypeError, match="load_model"):
        mechsink.wrap("gpt2")


def test_wrap_hf_without_tokenizer_never_touches_the_network(monkeypatch):
    """Regression: wrap_hf(model, None, name=...) looked the tokenizer up on a model hub by name
    (~48 s of retries offline, then an OSError). With hub access switched on and every socket
    refused, it must finish without trying to connect, and give a bridge without a tokenizer."""
    import socket

    import huggingface_hub.constants

    from mechsink.model import wrap_hf
    from mechsink.model.zoo import random_hf_model

    attempts: list[str] = []

    def refuse(*args, **kwargs):
        attempts.append(repr(args[:2]))
        raise OSError("network refused by the test")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    hf, _ = random_hf_model("gpt2-tiny", seed=0)
    model = wrap_hf(hf, None, name="someone/not-on-this-machine")
    assert attempts == []
    assert model.tokenizer is None
    tokens = torch.tensor([[50256, 15496, 995]])
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max().item() < 1e-4
