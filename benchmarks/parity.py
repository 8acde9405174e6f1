"""Parity figures: how far the bridge's logits and residual stream are from plain transformers.

Compares ``hook_resid_pre`` of every layer with transformers' ``output_hidden_states`` (eager
attention) and the logits, on the same tokens; prints max abs and max relative difference.

    python benchmarks/parity.py [--models smollm2-135m random:gpt2-tiny random:llama-tiny]
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM

from mechsink import load_model
from mechsink.model import to_tokens
from mechsink.model.zoo import converted_dir, random_hf_model

TEXT = "Attention sinks appear in nearly every language model, at position zero. " * 3


def plain_model(name: str):
    if name.startswith("random:"):
        return random_hf_model(name.removeprefix("random:"), seed=0)[0]
    return AutoModelForCausalLM.from_pretrained(
        str(converted_dir(name)), dtype=torch.float32, attn_implementation="eager"
    ).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+",
                        default=["smollm2-135m", "random:gpt2-tiny", "random:llama-tiny"])
    args = parser.parse_args()
    print("| model | T | max abs diff, resid | max rel diff, resid | max abs diff, logits |")
    print("|---|---|---|---|---|")
    for name in args.models:
        bridge = load_model(name, device="cpu")
        tokens = to_tokens(bridge, TEXT, prepend_bos=True)
        with torch.no_grad():
            logits, cache = bridge.run_with_cache(tokens)
            ref = plain_model(name)(tokens, output_hidden_states=True)
        abs_d, rel_d = 0.0, 0.0
        for layer in range(bridge.cfg.n_layers):
            ours, theirs = cache[f"blocks.{layer}.hook_resid_pre"], ref.hidden_states[layer]
            diff = (ours - theirs).abs()
            abs_d = max(abs_d, diff.max().item())
            rel_d = max(rel_d, (diff / theirs.abs().clamp_min(1.0)).max().item())
        logit_d = (logits - ref.logits).abs().max().item()
        print(f"| {name} | {tokens.shape[1]} | {abs_d:.2e} | {rel_d:.2e} | {logit_d:.2e} |")


if __name__ == "__main__":
    main()
