"""The query-bias circuit of GPT-2-style models (learned query bias, absolute positions), as a
2026 study of such models describes it.

The claim: in models with a learned query bias and absolute positions, the sink comes from
(i) the query bias b_Q, (ii) the layer-0 MLP acting on position 0's embedding, (iii) structure
in W_K. We (1) find the sink heads, (2) split each one's logits into the query-independent
Delta_j = b_Q . (x_j W_K) and the rest and compare how much each favours key 0, then (3) remove
each part in turn and measure the sink score again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mechsink.bridge import act_name, norm_params
from mechsink.experiments.result import ExperimentResult
from mechsink.interventions import ablate, applied, remove_query_bias, rotate_keys
from mechsink.measure import sink_scores
from mechsink.prompts import make_prompts
from mechsink.query_bias import delta_attribution, residual_components, split_attention_logits
from mechsink.training import task_of

FIGURE = "ablations.png"

SCHEMA = "mechsink-c6/1"
NECESSARY = 0.5  # a part is necessary when removing it leaves < half the sink score


def inputs(model: Any, name: str | None, n: int, seq_len: int) -> torch.Tensor:
    """Held-out task sequences for a task organism, natural text with BOS otherwise."""
    task = task_of(name) if name else None
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
                              cache[act_name("ln1.hook_scale", layer)], w, b,
                              model.W_K[layer], model.b_Q[layer])
    split = split_attention_logits(cache[act_name("ln1.hook_out", layer)], model.W_Q[layer],
                                   model.b_Q[layer], model.W_K[layer], model.b_K[layer])
    delta, rest = split.delta[:, head], split.rest[:, head]  # [b, key], [b, query, key]
    t = delta.shape[-1]
    causal = torch.ones(t, t).tril().bool()[1:, 1:]  # keys 1..i for queries 1..T-1
    rest_others = (rest[:, 1:, 1:] * causal).sum(-1) / causal.sum(-1)
    return {"delta_key0_minus_rest": (delta[:, 0] - delta[:, 1:].mean(-1)).mean().item(),
            "content_key0_minus_rest": (rest[:, 1:, 0] - rest_others).mean().item(),
            "delta0_parts": {k: v[:, head].mean().item() for k, v in parts.items()}}


def run(model: Any, *, model_name: str | None = None, n: int = 32, seq_len: int = 64,
        top: int = 4) -> ExperimentResult:
    """Study the ``top`` strongest sink heads on ``n`` sequences of ``seq_len`` tokens (the
    organism's task for a task organism, natural text with BOS otherwise)."""
    model_name = model_name or model.cfg.model_name
    tokens = inputs(model, model_name, n, seq_len)
    base = head_scores(model, tokens)
    order = base.flatten().argsort(descending=True)[: top].tolist()
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
    result = {"schema": SCHEMA, "model": model_name, "n": n, "seq_len": seq_len,
              "inputs": "task" if task_of(model_name) else "natural text, BOS",
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
    return ExperimentResult("gpt2_query_bias", result)


def summary(result: dict[str, Any]) -> str:
    """The Markdown summary: key-0 advantage per head, Delta_0's parts, the ablations."""
    lines = [f"# Query-bias circuit on {result['model']}", "",
             f"Inputs: {result['n']} sequences of {result['seq_len']} tokens "
             f"({result['inputs']}). Sink score: key 0, "
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
    lines += ["", f"![ablations]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_ablations

    return plot_ablations(data, path)
