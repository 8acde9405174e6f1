"""A fresh model written shard by shard as an ``hf:`` folder loads in bfloat16 through mechsink
and computes what plain transformers computes from the same tensors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from transformers import LlamaConfig, LlamaForCausalLM

import mechsink
from mechsink.errors import BadInputError
from mechsink.model.zoo.random_folder import INDEX, write_random_hf_folder


def _config(vocab: int = 50304) -> LlamaConfig:
    # Llama-3's shape ratios at a tiny size: grouped K/V (4 query, 2 kv heads), gated MLP,
    # RoPE theta 500000, untied embeddings, a vocabulary larger than the tokenizer's
    return LlamaConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=224, vocab_size=vocab,
                       rope_theta=500000.0, max_position_embeddings=256, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256)


def _read_all(folder) -> dict[str, torch.Tensor]:
    """Every tensor of the folder, read shard by shard with safetensors alone."""
    index = json.loads((folder / INDEX).read_text())
    out = {}
    for file in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / file), framework="pt") as f:
            for k in f.keys():
                assert index["weight_map"][k] == file
                out[k] = f.get_tensor(k)
    return out


def test_written_folder_loads_in_bfloat16_and_matches_transformers(tmp_path):
    folder = tmp_path / "llama"
    # 128 KiB shards: each 6.4 MiB vocabulary matrix alone, about a block per shard
    write_random_hf_folder(_config(), folder, "bfloat16", seed=3, shard_bytes=2**17)
    index = json.loads((folder / INDEX).read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) >= 4 and len(list(folder.glob("*.safetensors"))) == len(shards)
    tensors = _read_all(folder)
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert index["metadata"]["total_size"] == sum(t.numel() * 2 for t in tensors.values())
    # the checkpoint names and shapes are the ones transformers builds for the config
    reference = LlamaForCausalLM(_config()).state_dict()
    assert {k: tuple(v.shape) for k, v in tensors.items()} == \
        {k: tuple(v.shape) for k, v in reference.items()}
    assert torch.equal(tensors["model.norm.weight"].float(), torch.ones(64))
    emb = tensors["model.embed_tokens.weight"].float()
    assert abs(emb.std().item() - 0.02) < 1e-3 and abs(emb.mean().item()) < 1e-3
    assert not torch.equal(tensors["model.layers.0.mlp.up_proj.weight"],
                           tensors["model.layers.1.mlp.up_proj.weight"])

    model = mechsink.load_model(f"hf:{folder}", device="cpu", dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    tokens = model.to_tokens("The capital of France is Paris, and the capital of Spain is")
    with torch.no_grad():
        got = model(tokens)
        # independent: the config read back by transformers, the tensors set by hand
        hf = LlamaForCausalLM(type(_config()).from_pretrained(str(folder))).to(torch.bfloat16)
        hf.load_state_dict(tensors, strict=True)
        want = hf.eval()(tokens).logits
    assert got.shape == (1, tokens.shape[1], 50304)
    assert torch.equal(got[:, 0], want[:, 0])  # no rotation at position 0: bit for bit
    # later positions within bfloat16's rounding (the bridge computes RoPE's angles its own way)
    torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=0)


def test_same_seed_same_tensors_whatever_the_sharding(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_random_hf_folder(_config(), a, seed=1, shard_bytes=2**20)
    write_random_hf_folder(_config(), b, seed=1, shard_bytes=2**40)
    ta, tb = _read_all(a), _read_all(b)
    assert len(set(json.loads((b / INDEX).read_text())["weight_map"].values())) == 1
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


def test_refused_before_writing(tmp_path):
    with pytest.raises(BadInputError, match="vocab_size >= 50257"):
        write_random_hf_folder(_config(vocab=1000), tmp_path / "small-vocab")
    assert not (tmp_path / "small-vocab").exists()
    (tmp_path / "taken").mkdir()
    with pytest.raises(BadInputError, match="already exists"):
        write_random_hf_folder(_config(), tmp_path / "taken")
    assert list(tmp_path.iterdir()) == [tmp_path / "taken"]
