"""Loading a bfloat16 folder holds about one copy of the weights in bfloat16 at its peak (no
float32 copy on the way): the peak resident memory of ``load_model``, measured in a fresh
process against the weights' own size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

MiB = 2**20

SCRIPT = """
import json, resource, sys
from mechsink import load_model
from mechsink.model.zoo import gpt2_tokenizer
tok = gpt2_tokenizer()
# a first load of a tiny folder: the libraries' code and first-use allocations are then in place
load_model("hf:" + sys.argv[2], device="cpu", dtype="bfloat16", tokenizer=tok)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
model = load_model("hf:" + sys.argv[1], device="cpu", dtype="bfloat16", tokenizer=tok)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
dtypes = sorted({str(p.dtype) for p in model.parameters()})
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"base": base * 1024, "peak": peak * 1024, "weights": weights,
                  "dtypes": dtypes}))
"""


def _llama(folder: Path, hidden: int, layers: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=8,
                      num_key_value_heads=2, intermediate_size=hidden * 3, vocab_size=50257,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      bos_token_id=50256, eos_token_id=50256)
    before = torch.get_default_dtype()
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bfloat16: never a float32 copy here
    try:
        model = LlamaForCausalLM(cfg)
    finally:
        torch.set_default_dtype(before)
    model.save_pretrained(folder)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ru_maxrss in KiB (Linux)")
def test_bf16_loading_peak_is_about_one_copy_of_the_weights(tmp_path):
    big, small = tmp_path / "big", tmp_path / "small"
    _llama(big, 512, 4)  # ~60 MiB of bfloat16 weights, most of it the two vocabulary matrices
    _llama(small, 64, 1)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(big), str(small)], env=env,
                         capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["dtypes"] == ["torch.bfloat16"]
    assert got["weights"] > 50 * MiB
    grown = got["peak"] - got["base"]
    # a float32 copy on the way would add 2x the bfloat16 weights
    print(f"load peak: {grown / MiB:.1f} MiB over the weights' {got['weights'] / MiB:.1f} MiB")
    assert grown <= 1.5 * got["weights"] + 48 * MiB, got
