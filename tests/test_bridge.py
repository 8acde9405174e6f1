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


# --- weights: the attention scale and the key projections, against the model's own hooks ----


def _tiny(kind: str):
    """A bridge the fixtures do not cover: Gemma 3 whose query_pre_attn_scalar (144) is not
    head_dim (16), GPT-2 scaled by the inverse layer index, Qwen2 (GQA) with key biases."""
    from transformers import Gemma3TextConfig, GPT2Config, Qwen2Config

    from mechsink.model import wrap_hf
    from mechsink.model.zoo import seeded_model

    small = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    if kind == "gemma3":
        config = Gemma3TextConfig(**small, head_dim=16, query_pre_attn_scalar=144,
                                  sliding_window=4,
                                  layer_types=["sliding_attention", "full_attention"])
    elif kind == "gpt2-inverse-layer":
        config = GPT2Config(n_layer=3, n_embd=64, n_head=4, n_positions=64, vocab_size=1000,
                            scale_attn_by_inverse_layer_idx=True)
    else:
        config = Qwen2Config(**small)
    hf = seeded_model(config, seed=0)
    if kind == "qwen2":
        with torch.no_grad():  # learned-looking biases (they start at zero)
            for layer in hf.model.layers:
                layer.self_attn.k_proj.bias.normal_(0, 1, generator=torch.Generator()
                                                    .manual_seed(layer.self_attn.layer_idx))
    return wrap_hf(hf, None, name=kind)


@pytest.mark.parametrize("name", ["gpt2_tiny", "llama_tiny", "gemma3", "gpt2-inverse-layer"])
def test_attention_scale_is_what_the_attention_scores_are_divided_by(request, name):
    """q . k / attention_scale(model, layer) == the model's own hook_attn_scores on every
    visible key (GPT-2 style, Llama style with GQA and rotary, Gemma 3 with q/k norms,
    query_pre_attn_scalar and a sliding window, GPT-2 with a scale per layer)."""
    from mechsink.model import act_name, attention_scale, n_kv_heads

    model = request.getfixturevalue(name) if name.endswith("_tiny") else _tiny(name)
    tokens = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    group = int(model.cfg.n_heads) // n_kv_heads(model)
    for layer in range(int(model.cfg.n_layers)):
        def final(kind: str, layer: int = layer) -> torch.Tensor:  # what enters q . k
            rotated = act_name(f"rot_{kind}", layer)
            return cache[rotated] if rotated in cache else cache[act_name(kind, layer)]

        q, k = final("q"), final("k").repeat_interleave(group, dim=2)
        dots = torch.einsum("bqhd,bkhd->bhqk", q, k)
        scores = cache[act_name("attn_scores", layer)]
        visible = scores > torch.finfo(scores.dtype).min / 2
        assert visible.sum() > 0
        torch.testing.assert_close((dots / attention_scale(model, layer))[visible],
                                   scores[visible], rtol=1e-5, atol=1e-5)
    if name == "gemma3":
        assert attention_scale(model) == pytest.approx(12.0)  # sqrt(144), not sqrt(16)
    if name == "gpt2-inverse-layer":
        assert [attention_scale(model, layer) for layer in range(3)] == [4.0, 8.0, 12.0]
        with pytest.raises(BadInputError, match="differs between layers"):
            attention_scale(model)
    else:
        assert attention_scale(model) == attention_scale(model, 0)


def test_attention_scale_refuses_a_layer_the_model_has_not(gpt2_tiny):
    from mechsink.model import attention_scale

    with pytest.raises(BadInputError, match="outside 0..1"):
        attention_scale(gpt2_tiny, 2)


def test_key_accessors_on_a_grouped_model_with_key_biases():
    """On a bridge with GQA and learned key biases (Qwen2), hook_k is the attention input times
    key_weights plus key_bias, per KV head."""
    from mechsink.model import act_name, key_bias, key_weights, n_kv_heads

    model = _tiny("qwen2")
    tokens = torch.randint(0, 1000, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    w_k, b_k = key_weights(model), key_bias(model)
    assert b_k is not None and b_k.abs().max() > 0.5
    assert w_k.shape == (2, n_kv_heads(model), 64, 16) and b_k.shape == (2, 2, 16)
    for layer in range(2):
        x = cache[f"blocks.{layer}.attn.hook_in"]
        mine = torch.einsum("bpd,gde->bpge", x, w_k[layer]) + b_k[layer]
        torch.testing.assert_close(mine, cache[act_name("k", layer)], rtol=1e-5, atol=1e-5)


# --- the patches of TransformerLens / transformers internals -----------------------------------


def test_every_patch_names_the_versions_it_targets_and_they_are_installed():
    """Each module of mechsink.model.patches says what it targets, why and when it can go, and
    the installed libraries are the versions it was written against (a new major version
    fails here, so that someone checks the patch again)."""
    import importlib
    import pkgutil
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet

    import mechsink.model.patches as patches

    found = [m.name for m in pkgutil.iter_modules(patches.__path__)]
    assert len(found) >= 8
    for name in found:
        module = importlib.import_module(f"mechsink.model.patches.{name}")
        doc = module.__doc__ or ""
        assert all(part in doc for part in ("Targets:", "Why:", "Remove when:")), name
        assert f"patches.{name}`" in (patches.__doc__ or ""), f"{name} is not listed"
        assert module.TARGETS, name
        for package, spec in module.TARGETS.items():
            assert version(package) in SpecifierSet(spec), (name, package, version(package))


# --- what TransformerLens declares and what the model does (issue 25) --------------------------


def _suite_model(arch, tmp_path, dtype=None):
    """A tiny random-init ``arch`` from the architecture suite's builder, through hf:<folder>,
    with transformers' own logits on the suite's probe tokens."""
    import transformers

    import mechsink
    from tests.architectures import builder

    folder = builder.save(arch, tmp_path).folder
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder),
                                                           attn_implementation="eager")
    tokens = torch.tensor(builder.PROBE)
    with torch.no_grad():
        logits = hf(tokens).logits
    return mechsink.load_model(f"hf:{folder}", device="cpu", dtype=dtype), hf, tokens, logits


@pytest.mark.parametrize("arch", ["Gemma2ForCausalLM", "CohereForCausalLM"])
def test_unembed_applies_the_models_final_logit_step(arch, tmp_path):
    """Gemma 2's final soft-cap and Cohere's logit scale: mechsink's unembedding (what the
    built-in logit metrics read) equals transformers' logits (it skipped them: 0.5 and 15 off,
    relative to the largest logit)."""
    from mechsink.model import act_name, capabilities, unembed

    model, _, tokens, logits = _suite_model(arch, tmp_path)
    last = act_name("resid_post", int(model.cfg.n_layers) - 1)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=[last])
        got = unembed(model, cache[last])
    plain = model.unembed(model.ln_final(cache[last]))
    assert (plain - logits).abs().max() > 1.0  # the step bites on this model
    assert (got - logits).abs().max() <= 1e-4 * logits.abs().max()
    assert capabilities(model).unembed_exact


def test_run_from_layer_falls_back_where_start_at_layer_ignores_the_residual(tmp_path):
    """Bloom's bridge ignores the residual given to start_at_layer (0.19 off): the probe finds
    it and run_from_layer injects the residual by a hook instead."""
    from mechsink.model import act_name, capabilities, run_from_layer, supports_prefix_reuse

    model, _, tokens, logits = _suite_model("BloomForCausalLM", tmp_path)
    caps = capabilities(model)
    assert not caps.start_at_layer and caps.start_diff > 1e-2
    assert not supports_prefix_reuse(model)
    name = act_name("resid_pre", 1)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=[name])
        got = run_from_layer(model, cache[name].clone(), 1)
        swapped = run_from_layer(model, cache[name].flip(0).clone(), 1)
    assert (got - logits).abs().max() <= 1e-4 * logits.abs().max()
    assert (swapped - logits.flip(0)).abs().max() <= 1e-4 * logits.abs().max()


def test_capabilities_on_a_model_where_every_shortcut_holds(llama_tiny):
    from mechsink.model import capabilities

    caps = capabilities(llama_tiny)
    assert caps is capabilities(llama_tiny)  # probed once, cached on the model
    assert caps.start_at_layer and caps.unembed_exact and caps.split_qkv and caps.rotary_qk
    assert caps.grows_at("hook_resid_pre")


def test_attention_hooks_fire_on_a_fused_qkv_model(tmp_path):
    """GPT-NeoX (fused QKV): TransformerLens declares hook_rot_q/k but its bridge never calls
    them; mechsink.model.patches.attention_hooks makes them fire (values checked against
    transformers in tests/architectures/test_qkv.py)."""
    from mechsink.model import capabilities, has_hook

    model, *_ = _suite_model("GPTNeoXForCausalLM", tmp_path)
    assert has_hook(model, "blocks.0.attn.hook_rot_q")
    caps = capabilities(model)
    assert caps.rotary_qk and caps.split_qkv


@pytest.mark.parametrize(("arch", "d_mlp_field", "act"), [
    ("OPTForCausalLM", "ffn_dim", "relu"), ("XGLMForCausalLM", "ffn_dim", "gelu"),
    ("FalconForCausalLM", "ffn_hidden_size", "gelu"), ("BloomForCausalLM", None, "gelu_tanh"),
])
def test_architecture_summary_reads_what_the_bridge_reports_wrongly(arch, d_mlp_field, act,
                                                                    tmp_path):
    """The bridge says d_mlp = 4 x d_model for OPT/XGLM and relu for Bloom/Falcon; the MLP's
    own weights and the transformers config say otherwise."""
    model, hf, *_ = _suite_model(arch, tmp_path)
    summary = architecture_summary(model)
    widths = {m.out_features for n, m in hf.named_modules()
              if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in
              ("fc1", "dense_h_to_4h", "fc_in", "c_fc")}
    assert widths == {summary["d_mlp"]}
    if d_mlp_field:
        assert summary["d_mlp"] == getattr(hf.config, d_mlp_field)
    assert summary["activation"] == act


def test_architecture_summary_dtype_is_the_weights(tmp_path):
    model, *_ = _suite_model("LlamaForCausalLM", tmp_path, dtype="bfloat16")
    assert str(model.cfg.dtype) == "torch.float32"  # what the bridge says
    assert architecture_summary(model)["dtype"] == "bfloat16"
