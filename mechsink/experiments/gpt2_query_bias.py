"""The query-bias circuit of GPT-2-style models (learned query bias, absolute positions), as a
2026 study of such models describes it.

The claim: in models with a learned query bias and absolute positions, the sink comes from
(i) the query bias b_Q, (ii) the layer-0 MLP acting on position 0's embedding, (iii) structure
in W_K. We (1) find the sink heads, (2) split each one's logits into four bilinear parts
(content, the query-independent Delta_j = b_Q . (x_j W_K), the key-bias part and b_Q . b_K,
each rotated as the model rotates queries and keys) and compare how much each favours key 0,
then (3) remove each part in turn (query bias; key bias and both where the model has one; W_K's
structure; the layer-0 MLP at position 0) and measure the sink score again. On a model with
rotary positions (Qwen2) the key-bias parts depend on the key's position, so they need not
cancel in the softmax as they do under absolute positions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult
from mechsink.inputs.prompts import make_prompts
from mechsink.interventions.edits import (
    Intervention,
    ablate,
    remove_key_bias,
    remove_query_bias,
    rotate_keys,
)
from mechsink.interventions.readout import read_with_edits
from mechsink.measure.forward import of_cache
from mechsink.measure.logit_split import BIAS_PARTS, BiasSplit, bias_logit_split
from mechsink.measure.query_bias import delta_attribution, residual_components
from mechsink.measure.sinks import HOOKS as SINK_HOOKS
from mechsink.measure.sinks import sink_scores
from mechsink.model import act_name, key_bias, key_weights, norm_params, query_bias
from mechsink.training.loop import task_of

FIGURE = "ablations.png"

SCHEMA = "mechsink-c6/2"
NECESSARY = 0.5  # a part is necessary when removing it leaves < half the sink score


def inputs(model: Any, name: str | None, n: int, seq_len: int) -> torch.Tensor:
    """Held-out task sequences for a task organism, natural text with BOS otherwise."""
    task = task_of(name) if name else None
    if task is not None:
        return task.batch(10_000, 0, n, seq_len)
    return make_prompts(model, "natural", "bos", n=n, seq_len=seq_len, seed=0).tokens


def head_scores(model: Any, tokens: torch.Tensor, interventions: Sequence[Intervention] = ()
                ) -> torch.Tensor:
    """Sink score (key 0, queries i > 0) per layer and head, averaged over sequences."""
    got = read_with_edits(model, tokens, {"sinks": of_cache(SINK_HOOKS, sink_scores)},
                          interventions)
    return got["sinks"].no_self.mean(0)


def per_query_head_keys(model: Any, layer: int) -> torch.Tensor:
    """``W_K`` of ``layer`` with one entry per query head, ``[head, d_model, d_head]`` (under
    grouped-query attention each KV head's projection serves its group of query heads)."""
    w_k = key_weights(model)[layer]  # [kv_head, d_model, d_head]
    return w_k.repeat_interleave(int(model.cfg.n_heads) // w_k.shape[0], dim=0)


def key0_advantage(model: Any, cache: Any, split: BiasSplit, layer: int, head: int) -> dict:
    """How much each logit part favours key 0 over the other keys a query sees (logit units,
    queries i >= 1 against keys 1..i), and, on GPT-2-style models (absolute positions), which
    residual pieces (token / position embedding, earlier outputs) make up Delta_0."""
    t = split.parts["content"].shape[-1]
    causal = torch.ones(t, t).tril().bool()[1:, 1:]  # keys 1..i for queries 1..T-1

    def advantage(part: torch.Tensor) -> float:
        p = part[:, head].float()  # [batch, query, key]
        others = (p[:, 1:, 1:] * causal).sum(-1) / causal.sum(-1)
        return (p[:, 1:, 0] - others).mean().item()

    adv = {name: advantage(part) for name, part in split.parts.items()}
    out = {"delta_key0_minus_rest": adv["query bias"],
           "content_key0_minus_rest": sum(v for k, v in adv.items() if k != "query bias"),
           "parts_key0_minus_rest": adv,
           "parts_at_key0": {k: v[:, head, 1:, 0].float().mean().item()
                             for k, v in split.parts.items()},
           "delta0_parts": None}
    if "hook_pos_embed" in cache:  # absolute positions: residual pieces named GPT-2 style
        w, b = norm_params(model, layer)
        b_q = query_bias(model, layer)
        w_k = per_query_head_keys(model, layer)
        parts = delta_attribution(residual_components(cache, layer),
                                  cache[act_name("ln1.hook_scale", layer)], w, b, w_k,
                                  torch.zeros(w_k.shape[0], w_k.shape[-1]) if b_q is None
                                  else b_q)
        out["delta0_parts"] = {k: v[:, head].mean().item() for k, v in parts.items()}
    return out


def has_key_bias(model: Any, layers: list[int]) -> bool:
    """Whether every layer in ``layers`` has a learned, non-zero key bias."""
    b_k = key_bias(model)
    return b_k is not None and all(bool(b_k[lay].abs().max() > 0) for lay in layers)


def run(model: Any, *, model_name: str | None = None, n: int = 32, seq_len: int = 64,
        top: int = 4) -> ExperimentResult:
    """Study the ``top`` strongest sink heads on ``n`` sequences of ``seq_len`` tokens (the
    organism's task for a task organism, natural text with BOS otherwise).

    ``n``: sequences; ``seq_len``: tokens per sequence; ``top``: number of sink heads to study.
    """
    check_experiment_settings("gpt2_query_bias", locals())  # before any work, as the CLI does
    model_name = model_name or model.cfg.model_name
    tokens = inputs(model, model_name, n, seq_len)
    base = head_scores(model, tokens)
    order = base.flatten().argsort(descending=True)[: top].tolist()
    heads = [(i // base.shape[1], i % base.shape[1]) for i in order]
    sink_layers = sorted({layer for layer, _ in heads})
    with torch.no_grad():  # one clean run feeds the Delta_0 attribution
        _, cache = model.run_with_cache(tokens)
    splits = {layer: bias_logit_split(model, tokens, layer) for layer in sink_layers}

    ablations = {
        "no query bias": [remove_query_bias(model, layer) for layer in sink_layers],
        **({"no key bias": [remove_key_bias(model, layer) for layer in sink_layers],
            "no query or key bias": [edit for layer in sink_layers for edit in (
                remove_query_bias(model, layer), remove_key_bias(model, layer))]}
           if has_key_bias(model, sink_layers) else {}),
        "W_K rotated": [rotate_keys(model, layer, seed=0) for layer in sink_layers],
        "layer-0 MLP at pos 0 mean-ablated": [ablate(model, "hook_mlp_out", 0,
                                                     mode="position_mean", positions=[0])],
    }
    result = {"schema": SCHEMA, "model": model_name, "n": n, "seq_len": seq_len,
              "inputs": "task" if task_of(model_name) else "natural text, BOS",
              "sink_heads": [{"layer": lay, "head": h, "sink_score": base[lay, h].item(),
                              **key0_advantage(model, cache, splits[lay], lay, h)}
                             for lay, h in heads],
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
             "How much each part of the attention logit favours key 0 over the other keys a "
             "query sees (logit units; the parts sum to the model's own logit): content "
             "(x_i W_Q).(x_j W_K), query bias b_Q.(x_j W_K) (Delta_j), key bias (x_i W_Q).b_K, "
             "both b_Q.b_K; rotated as the model rotates them.", "",
             "| head | sink score | " + " | ".join(BIAS_PARTS) + " |",
             "|---|---|" + "---|" * len(BIAS_PARTS)]
    for h in result["sink_heads"]:
        lines.append(f"| L{h['layer']}H{h['head']} | {h['sink_score']:.3f} | "
                     + " | ".join(f"{h['parts_key0_minus_rest'][k]:+.3f}" for k in BIAS_PARTS)
                     + " |")
    if result["sink_heads"][0]["delta0_parts"] is not None:
        names = list(result["sink_heads"][0]["delta0_parts"])
        lines += ["", "Delta_0 split over the residual pieces at position 0 (LayerNorm scale "
                  "frozen):", "", "| head | " + " | ".join(names) + " |",
                  "|---" * (len(names) + 1) + "|"]
        for h in result["sink_heads"]:
            lines.append(f"| L{h['layer']}H{h['head']} | "
                         + " | ".join(f"{h['delta0_parts'][k]:+.3f}" for k in names) + " |")
    lines += ["", f"Criterion: a part is *necessary* when removing it leaves less than "
              f"{NECESSARY:.0%} of the studied heads' summed sink score, *dispensable* otherwise.",
              "", "| ablation | sink score per head after | fraction kept | verdict |",
              "|---|---|---|---|"]
    for name, a in result["ablations"].items():
        lines.append(f"| {name} | {', '.join(f'{v:.3f}' for v in a['per_head'])} | "
                     f"{a['fraction_kept']:.2f} | {a['verdict']} |")
    lines += ["", f"![ablations]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_ablations

    return plot_ablations(data, path)
