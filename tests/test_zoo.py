"""The model zoo: parity with plain transformers, hook shapes, seeds, organisms, errors."""

from __future__ import annotations

import json

import pytest
import torch
from parity_refs import decoder_residuals, transformers_gguf_load

from mechsink import load_model, save_organism
from mechsink.errors import BadInputError, MechsinkError, UnknownModelError
from mechsink.model import hf_model_of, n_kv_heads, to_tokens
from mechsink.model.zoo import converted_dir, random_hf_model

TEXT = "When attention sinks emerge, the first token takes most of the attention mass."


def _assert_parity(bridge, plain, tokens):
    logits, seen = decoder_residuals(plain, tokens)
    with torch.no_grad():
        b_logits, cache = bridge.run_with_cache(tokens)
    n_layers = bridge.cfg.n_layers
    ours = []
    for layer in range(n_layers):
        ours.append(("in", cache[f"blocks.{layer}.hook_resid_pre"]))
        ours.append(("out", cache[f"blocks.{layer}.hook_resid_post"]))
    assert [k for k, _ in seen] == [k for k, _ in ours]
    for (_, theirs), (_, mine) in zip(seen, ours, strict=False):
        torch.testing.assert_close(mine, theirs, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(b_logits, logits, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("spec", ["gpt2-tiny", "llama-tiny"])
def test_random_models_match_plain_transformers(spec):
    bridge = load_model(f"random:{spec}", device="cpu", seed=3)
    plain, _ = random_hf_model(spec, seed=3)
    tokens = to_tokens(bridge, TEXT, prepend_bos=True)
    _assert_parity(bridge, plain, tokens)


def _plain_converted(name: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(converted_dir(name)), dtype=torch.float32, attn_implementation="eager"
    ).eval()


@pytest.mark.slow
def test_smollm2_matches_plain_transformers(smollm2):
    tokens = to_tokens(smollm2, TEXT, prepend_bos=True)
    _assert_parity(smollm2, _plain_converted("smollm2-135m"), tokens)


@pytest.mark.slow
def test_gemma3_matches_plain_transformers():
    gemma = load_model("gemma3-270m", device="cpu")
    tokens = to_tokens(gemma, TEXT, prepend_bos=True)
    _assert_parity(gemma, _plain_converted("gemma3-270m"), tokens)


@pytest.mark.slow
def test_qwen25_matches_transformers_own_gguf_load():
    """The cached conversion equals transformers reading the joined GGUF itself, and the model
    has the learned query and key biases it is in the zoo for."""
    from mechsink.model.zoo import gguf_file

    qwen = load_model("qwen2.5-0.5b", device="cpu")
    plain = transformers_gguf_load(gguf_file("qwen2.5-0.5b"))
    tokens = to_tokens(qwen, TEXT, prepend_bos=True)
    _assert_parity(qwen, plain, tokens)
    attn = plain.model.layers[0].self_attn
    assert attn.q_proj.bias.abs().max() > 0.1 and attn.k_proj.bias.abs().max() > 0.1
    assert (qwen.cfg.n_layers, qwen.cfg.n_heads, n_kv_heads(qwen)) == (24, 14, 2)


@pytest.mark.slow
def test_smollm2_greedy_continuation_is_sensible(smollm2):
    from mechsink.model.generate import greedy_continue

    tokens = to_tokens(smollm2, "The capital of France is", prepend_bos=True)
    out = greedy_continue(smollm2, tokens, 3)
    assert "Paris" in smollm2.tokenizer.decode(out[0, tokens.shape[1]:])


HOOK_SHAPES = {
    "hook_resid_pre": ("T", "d_model"),
    "hook_resid_mid": ("T", "d_model"),
    "hook_resid_post": ("T", "d_model"),
    "hook_attn_out": ("T", "d_model"),
    "hook_mlp_out": ("T", "d_model"),
    "attn.hook_q": ("T", "n_heads", "d_head"),
    "attn.hook_k": ("T", "n_kv", "d_head"),
    "attn.hook_v": ("T", "n_kv", "d_head"),
    "attn.hook_z": ("T", "n_heads", "d_head"),
    "attn.hook_pattern": ("n_heads", "T", "T"),
    "mlp.hook_post": ("T", "d_mlp"),
}


@pytest.mark.parametrize("fixture", ["gpt2_tiny", "llama_tiny"])
def test_standard_hooks_fire_with_documented_shapes(fixture, request):
    model = request.getfixturevalue(fixture)
    tokens = to_tokens(model, [TEXT, TEXT], prepend_bos=True)
    cfg = model.cfg
    dims = dict(T=tokens.shape[1], d_model=cfg.d_model, n_heads=cfg.n_heads,
                n_kv=n_kv_heads(model), d_head=cfg.d_head, d_mlp=cfg.d_mlp)
    fired: dict[str, tuple] = {}

    def recorder(name):  # alias hooks report their canonical name, so key by the one we asked
        def record(tensor, hook):
            fired[name] = tuple(tensor.shape)

        return record

    names = [f"blocks.{layer}.{name}" for layer in range(cfg.n_layers) for name in HOOK_SHAPES]
    hooks = [(name, recorder(name)) for name in names]
    model.run_with_hooks(tokens, fwd_hooks=hooks)
    for layer in range(cfg.n_layers):
        for name, shape in HOOK_SHAPES.items():
            assert fired[f"blocks.{layer}.{name}"] == (2, *(dims[d] for d in shape)), name
    if fixture == "llama_tiny":
        assert n_kv_heads(model) == 2 < cfg.n_heads  # GQA: k/v per KV head


def test_same_seed_same_model_and_different_seed_different():
    a = load_model("random:llama-tiny", device="cpu", seed=7)
    b = load_model("random:llama-tiny", device="cpu", seed=7)
    c = load_model("random:llama-tiny", device="cpu", seed=8)
    tokens = to_tokens(a, TEXT, prepend_bos=True)
    with torch.no_grad():
        la, lb, lc = a(tokens), b(tokens), c(tokens)
    assert torch.equal(la, lb)
    assert not torch.allclose(la, lc)


def test_loading_a_random_model_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_model("random:gpt2-tiny", device="cpu", seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_gpt2_family_keeps_query_bias_and_learned_positions(gpt2_tiny):
    hf = hf_model_of(gpt2_tiny)
    assert gpt2_tiny.cfg.positional_embedding_type == "standard"
    assert hf.transformer.h[0].attn.c_attn.bias is not None  # b_Q, b_K, b_V
    assert hf.transformer.wpe.weight.requires_grad


def test_folded_weights_keep_logits(gpt2_tiny):
    folded = load_model("random:gpt2-tiny", device="cpu", seed=0, fold_weights=True)
    tokens = to_tokens(gpt2_tiny, TEXT, prepend_bos=True)
    with torch.no_grad():
        torch.testing.assert_close(
            folded(tokens).log_softmax(-1), gpt2_tiny(tokens).log_softmax(-1), atol=1e-4, rtol=0
        )


@pytest.mark.parametrize("fixture", ["gpt2_tiny", "llama_tiny"])
def test_organism_round_trip_gives_identical_logits(tmp_path, fixture, request):
    model = request.getfixturevalue(fixture)
    folder = save_organism(model, tmp_path / "org", metadata={"recipe": "test", "seed": 0})
    assert json.loads((folder / "mechsink.json").read_text())["recipe"] == "test"
    again = load_model(f"organism:{folder}", device="cpu")
    tokens = to_tokens(model, TEXT, prepend_bos=True)
    with torch.no_grad():
        assert torch.equal(again(tokens), model(tokens))


def test_save_organism_refuses_to_overwrite(tmp_path, gpt2_tiny):
    (tmp_path / "taken").mkdir()
    with pytest.raises(BadInputError, match="already exists"):
        save_organism(gpt2_tiny, tmp_path / "taken")


def test_unknown_model_lists_known_names():
    with pytest.raises(UnknownModelError) as info:
        load_model("gpt-17")
    message = str(info.value)
    assert "smollm2-135m" in message and "random:gpt2-tiny" in message


@pytest.mark.parametrize("name", ["random:gpt2-huge", "random:gpt2", "random:bert-tiny"])
def test_malformed_random_names_are_clear_errors(name):
    with pytest.raises(UnknownModelError, match="random:"):
        load_model(name)


def test_missing_organism_folder_is_a_clear_error(tmp_path):
    with pytest.raises(MechsinkError, match="does not exist"):
        load_model(f"organism:{tmp_path / 'nowhere'}")


def test_folder_without_marker_is_not_an_organism(tmp_path):
    with pytest.raises(MechsinkError, match="not a mechsink organism"):
        load_model(f"organism:{tmp_path}")


def test_seed_for_a_pretrained_model_is_an_error():
    with pytest.raises(BadInputError, match="seed"):
        load_model("smollm2-135m", seed=1)


def test_bad_dtype_is_an_error():
    with pytest.raises(BadInputError, match="dtype"):
        load_model("random:gpt2-tiny", dtype="int8")


def test_a_folder_without_a_tokenizer_is_refused(tmp_path):
    """Regression: a model folder with no tokenizer files loaded with a tokenizer that knows one
    token (every text became id 0, patching returned 1.0 everywhere). It is refused, saying
    what to do, and loads when a tokenizer is passed."""
    from mechsink.model.zoo import gpt2_tokenizer

    hf, _ = random_hf_model("gpt2-tiny", seed=0)
    hf.save_pretrained(tmp_path)
    with pytest.raises(MechsinkError, match="no tokenizer files") as info:
        load_model(f"hf:{tmp_path}", device="cpu")
    assert "tokenizer=" in str(info.value)
    model = load_model(f"hf:{tmp_path}", device="cpu", tokenizer=gpt2_tokenizer())
    assert to_tokens(model, "hello world", prepend_bos=False).tolist() == [[31373, 995]]
    tokens = torch.tensor([[50256, 31373, 995]])
    with torch.no_grad():
        assert (model(tokens) - hf(tokens).logits).abs().max().item() < 1e-4


def test_loading_prints_no_library_bars_off_a_terminal(capfd):
    """transformers' "Loading weights" bar follows mechsink's progress setting: silent when
    stderr is not a terminal (it printed into every log and pipe)."""
    from mechsink import load_model

    load_model("organism:bb-gpt2-tiny", device="cpu")
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err


def test_saving_prints_no_library_bars_off_a_terminal(capfd, tmp_path):
    """transformers' "Writing model shards" bar is silent off a terminal as well (every
    checkpoint of a training run printed one into its log)."""
    from mechsink import load_model
    from mechsink.model.zoo import save_organism

    model = load_model("organism:bb-gpt2-tiny", device="cpu")
    capfd.readouterr()
    save_organism(model, tmp_path / "copy")
    err = capfd.readouterr().err
    assert (tmp_path / "copy").is_dir()
    assert "Writing model shards" not in err and "it/s" not in err


# --- organism weights that do not fit its config (#29 item 12) -------------------------------


def _organism_copy(tmp_path):
    import shutil

    from mechsink.model.zoo import organism_folder

    folder = tmp_path / "org"
    shutil.copytree(organism_folder("bb-gpt2-tiny"), folder)
    return folder


def test_organism_weights_of_another_shape_are_one_line(tmp_path):
    folder = _organism_copy(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["n_inner"] = 128  # the weights hold 4 * 64 = 256 MLP neurons
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(MechsinkError, match=r"tensor transformer\.h\.0\.mlp\.c_fc\.weight has "
                       r"shape \[64, 256\], the config expects \[64, 128\]") as err:
        load_model(f"organism:{folder}", device="cpu")
    assert "\n" not in str(err.value)
    with pytest.raises(MechsinkError, match=r"c_fc\.weight has shape \[64, 256\]"):
        load_model(f"hf:{folder}", device="cpu")  # a plain folder is checked the same way


def test_organism_missing_a_weight_is_one_line(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _organism_copy(tmp_path)
    weights = load_file(str(folder / "model.safetensors"))
    del weights["transformer.h.1.ln_2.bias"]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(MechsinkError, match=r"no tensor transformer\.h\.1\.ln_2\.bias \(expected "
                       r"shape \[64\]; 1 missing"):
        load_model(f"organism:{folder}", device="cpu")


def test_organism_with_a_damaged_weights_file_is_one_line(tmp_path):
    folder = _organism_copy(tmp_path)
    (folder / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(MechsinkError, match="cannot be read as safetensors"):
        load_model(f"organism:{folder}", device="cpu")


def test_a_loaded_model_is_named_by_its_zoo_name(llama_tiny):
    """Results that fall back on cfg.model_name name the weights that ran, not the reference
    checkpoint TransformerLens associates with the architecture."""
    assert llama_tiny.cfg.model_name == "random:llama-tiny"
