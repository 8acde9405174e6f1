"""C6: the GPT-2 query-bias circuit (seeds/001b) on a GPT-2-style model.

The claim: in models with a learned query bias and absolute positions, the sink comes from
(i) the query bias b_Q, (ii) the layer-0 MLP acting on position 0's embedding, (iii) structure
in W_K. We (1) find the sink heads, (2) split each one's logits into the query-independent
Delta_j = b_Q . (x_j W_K) and the rest and compare how much each favours key 0, then (3) remove
each part in turn and measure the sink score again.

    python circuits/gpt2_query_bias.py --model organism:bb-gpt2-tiny --out runs/c6
    python circuits/gpt2_query_bias.py --model hf:gpt2 --out runs/c6-gpt2   # with hub access
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from mechsink import load_model
from mechsink.bridge import norm_params
from mechsink.interventions import ablate, applied, remove_query_bias, rotate_keys
from mechsink.io import atomic_write_text
from mechsink.measure import sink_scores
from mechsink.prompts import make_prompts
from mechsink.query_bias import delta_attribution, residual_components, split_attention_logits
from mechsink.training import task_of
from mechsink.viz.experiments import plot_ablations

SCHEMA = "mechsink-c6/1"
NECESSARY = 0.5  # a part is necessary when removing it leaves < half the sink score


def inputs(model, name: str, n: int, seq_len: int) -> torch.Tensor:
    """Held-out task sequences for a task organism, natural text with BOS otherwise."""
    task = task_of(name)
    if task is not None:
        return task.batch(10_000, 0, n, seq_len)
    return make_prompts(model, "natural", "bos", n=n, seq_len=seq_len, seed=0).tokens


@torch.no_grad()
def head_scores(model, tokens, interventions=()) -> torch.Tensor:
    """Sink score (key 0, queries i > 0) per layer and head, averaged over sequences."""
    with applied(model, list(interventions)):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    return sink_scores(cache).no_self.mean(0)


def key0_advantage(model, cache, layer: int, head: int) -> dict:
    """How much Delta and the rest favour key 0 over the other keys (logit units), and which
    residual pieces (token / position embedding, earlier outputs) make up Delta_0; read from
    the clean run's cache."""
    w, b = norm_params(model, layer)
    parts = delta_attribution(residual_components(cache, layer),
                              cache[f"blocks.{layer}.ln1.hook_scale"], w, b,
                              model.W_K[layer], model.b_Q[layer])
    split = split_attention_logits(cache[f"blocks.{layer}.ln1.hook_out"], model.W_Q[layer],
                                   model.b_Q[layer], model.W_K[layer], model.b_K[layer])
    delta, rest = split.delta[:, head], split.rest[:, head]  # [b, key], [b, query, key]
    t = delta.shape[-1]
    causal = torch.ones(t, t).tril().bool()[1:, 1:]  # keys 1..i for queries 1..T-1
    rest_others = (rest[:, 1:, 1:] * causal).sum(-1) / causal.sum(-1)
    return {"delta_key0_minus_rest": (delta[:, 0] - delta[:, 1:].mean(-1)).mean().item(),
            "content_key0_minus_rest": (rest[:, 1:, 0] - rest_others).mean().item(),
            "delta0_parts": {k: v[:, head].mean().item() for k, v in parts.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="organism:bb-gpt2-tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--top", type=int, default=4, help="number of sink heads to study")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    model = load_model(args.model, device="cpu")
    tokens = inputs(model, args.model, args.n, args.seq_len)
    base = head_scores(model, tokens)
    order = base.flatten().argsort(descending=True)[: args.top].tolist()
    heads = [(i // base.shape[1], i % base.shape[1]) for i in order]
    sink_layers = sorted({layer for layer, _ in heads})
    with torch.no_grad():  # one clean run feeds every head's logit split
        _, cache = model.run_with_cache(tokens)

    ablations = {
        "no query bias": [remove_query_bias(model, layer) for layer in sink_layers],
        "W_K rotated": [rotate_keys(model, layer, seed=0) for layer in sink_layers],
        "layer-0 MLP at pos 0 mean-ablated": [ablate(model, "hook_mlp_out", 0, mode="mean",
                                                     positions=[0])],
    }
    result = {"schema": SCHEMA, "model": args.model, "n": args.n, "seq_len": args.seq_len,
              "sink_heads": [{"layer": lay, "head": h, "sink_score": base[lay, h].item(),
                              **key0_advantage(model, cache, lay, h)} for lay, h in heads],
              "ablations": {}}
    for name, edits in ablations.items():
        after = head_scores(model, tokens, edits)
        per_head = [after[lay, h].item() for lay, h in heads]
        kept = sum(per_head) / max(1e-9, sum(base[lay, h].item() for lay, h in heads))
        applicable = not (name.startswith("layer-0 MLP") and sink_layers == [0])
        verdict = ("not applicable: every sink head is in layer 0, before the layer-0 MLP"
                   if not applicable else "necessary" if kept < NECESSARY else "dispensable")
        result["ablations"][name] = {"per_head": per_head, "fraction_kept": kept,
                                     "verdict": verdict}
    atomic_write_text(args.out / "result.json", json.dumps(result, indent=1))
    plot_ablations(result, args.out / "ablations.png")

    lines = [f"# C6: query-bias circuit on {args.model}", "",
             f"Inputs: {args.n} sequences of {args.seq_len} tokens "
             f"({'task' if task_of(args.model) else 'natural text, BOS'}). Sink score: key 0, "
             "queries i > 0.", "",
             "| head | sink score | Delta: key 0 minus others | rest: key 0 minus others |",
             "|---|---|---|---|"]
    for h in result["sink_heads"]:
        lines.append(f"| L{h['layer']}H{h['head']} | {h['sink_score']:.3f} | "
                     f"{h['delta_key0_minus_rest']:+.3f} | {h['content_key0_minus_rest']:+.3f} |")
    names = list(result["sink_heads"][0]["delta0_parts"])
    lines += ["", "Delta_0 split over the residual pieces at position 0 (LayerNorm scale frozen):",
              "", "| head | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for h in result["sink_heads"]:
        lines.append(f"| L{h['layer']}H{h['head']} | "
                     + " | ".join(f"{h['delta0_parts'][k]:+.3f}" for k in names) + " |")
    lines += ["", "| ablation | sink score per head after | fraction kept | verdict |",
              "|---|---|---|---|"]
    for name, a in result["ablations"].items():
        lines.append(f"| {name} | {', '.join(f'{v:.3f}' for v in a['per_head'])} | "
                     f"{a['fraction_kept']:.2f} | {a['verdict']} |")
    lines += ["", "![ablations](ablations.png)", ""]
    atomic_write_text(args.out / "summary.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
