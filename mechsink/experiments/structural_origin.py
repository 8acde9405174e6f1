"""Why position 0 becomes the sink (Li, Jiang, Sun et al. 2026, "The Structural Origin of
Attention Sink: Variance Discrepancy, Super Neurons, and Dimension Disparity"; the causal mask's
self-concentration at position 0 and the value non-mixing it causes).

1. Variance discrepancy: variance over sequences of the attention output per position, and the
   uniform-mixing prediction sum_j A_tj^2 (1 at position 0).
2. Super neurons: the largest down-projection input at position 0, the channel it writes, and
   that channel's size layer by layer.
3. Dose-response: scale the super neuron at position 0 by each factor; watch the channel and the
   sink at key 0.
4. Moving the sink to position k: (i) position k attends only to itself in every layer;
   (ii) token k's residual scaled up to position 0's norm at layer 1; (iii) the massive channel
   planted at k right after the super neuron's layer (position 0's value). Sink at k and at 0,
   and the channel at k, before and after.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mechsink.bridge import act_name
from mechsink.experiments.result import ExperimentResult
from mechsink.interventions import ablate, attend_only_to_self, scale_tokens
from mechsink.measure import variance_stats
from mechsink.prompts import make_prompts
from mechsink.readout import dominant_super_neuron, sink_readout

FIGURE = "structural_origin.png"

SCHEMA = "mechsink-structural-origin/1"


@torch.no_grad()
def variance_part(model: Any, n: int, seq_len: int) -> dict:
    out = {}
    for suite in ("random", "natural"):
        tokens = make_prompts(model, suite, "randfirst", n=n, seq_len=seq_len, seed=0).tokens
        _, cache = model.run_with_cache(tokens, names_filter=lambda h: h.endswith(
            ("hook_attn_out", "attn.hook_pattern")))
        stats = variance_stats(cache)
        predicted = stats.predicted
        out[suite] = {"ratio": stats.ratio.tolist(),
                      "predicted_ratio": (predicted[:, 0] / predicted[:, 1:].mean(-1)).tolist()}
    return out


def dose_response(model, tokens, sn: dict, scales: list[float]) -> list[dict]:
    rows = []
    for s in scales:
        edit = ablate(model, "mlp.hook_post", sn["layer"], mode="scale", scale=s,
                      units=[sn["neuron"]], positions=[0])
        r = sink_readout(model, tokens, [edit], key_positions=[0], channel=sn["channel"])
        rows.append({"scale": s, "sink_rate": r.rates[0], "sink_score": r.mean_score(0),
                     "channel_max_abs": r.channel_values[0].abs().max().item()})
    return rows


def move_the_sink(model, tokens, sn: dict, positions: list[int]) -> list[dict]:
    keys = [0, *positions]
    base = sink_readout(model, tokens, key_positions=keys, channel=sn["channel"])
    plant_layer = min(sn["layer"] + 1, model.cfg.n_layers - 1)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda h: h in (
            act_name("resid_pre", 1), act_name("resid_pre", plant_layer)))
    norms = cache[act_name("resid_pre", 1)].norm(dim=-1).mean(0)  # [pos]
    massive = cache[act_name("resid_pre", plant_layer)][:, 0, sn["channel"]].mean().item()
    rows = []
    for k in positions:
        edits = {"self-only mask": attend_only_to_self(model, range(model.cfg.n_layers), k),
                 "norm amplified": [scale_tokens(model, 1, [k], (norms[0] / norms[k]).item())],
                 "channel planted": [ablate(model, "hook_resid_pre", plant_layer, mode="set",
                                            value=massive, units=[sn["channel"]],
                                            positions=[k])]}
        for name, interventions in edits.items():
            after = sink_readout(model, tokens, interventions, key_positions=[0, k],
                          channel=sn["channel"])
            rows.append({"k": k, "intervention": name,
                         "sink_at_k_before": base.mean_score(k), "sink_at_k_after":
                         after.mean_score(k), "rate_at_k_after": after.rates[k],
                         "sink_at_0_before": base.mean_score(0),
                         "sink_at_0_after": after.mean_score(0),
                         "channel_at_k_before": base.channel_values[k].abs().max().item(),
                         "channel_at_k_after": after.channel_values[k].abs().max().item()})
    return rows


def channel_life(values: list[float]) -> dict[str, dict]:
    """Where the massive channel at position 0 (one value after each block) first reaches a
    tenth of its peak, where it grows most in one block, and where it falls most after the peak."""
    mag = [abs(v) for v in values]
    peak = max(range(len(mag)), key=mag.__getitem__)
    steps = [(lay, mag[lay] - (mag[lay - 1] if lay else 0.0)) for lay in range(len(mag))]
    grow = max(steps, key=lambda s: s[1])[0]
    falls = [s for s in steps if s[0] > peak]
    fall = min(falls, key=lambda s: s[1])[0] if falls else None

    def block(lay: int | None) -> dict | None:
        if lay is None:
            return None
        return {"layer": lay, "before": values[lay - 1] if lay else 0.0, "after": values[lay]}

    appears = next(lay for lay in range(len(mag)) if mag[lay] >= 0.1 * mag[peak])
    return {"appears": block(appears), "amplified": block(grow), "removed": block(fall),
            "peak": block(peak)}


def verdicts(result: dict) -> dict[str, str]:
    ratios = result["variance"]["random"]["ratio"]
    c1, later = ratios[0], statistics.median(ratios[1:])
    doses = {row["scale"]: row for row in result["dose_response"]}
    off, on = doses.get(0.0), doses.get(1.0)
    moved = [r for r in result["move"] if r["sink_at_k_after"] >= max(0.1, 2 * r[
        "sink_at_k_before"])]
    out = {"C1": f"{'supported' if c1 > 1 else 'not supported'} at layer 0: "
                 f"Var(pos 0) / Var(pos > 0) = {c1:.2f} on random input (uniform-mixing "
                 f"prediction {result['variance']['random']['predicted_ratio'][0]:.2f}); median "
                 f"over later layers {later:.2f}"}
    if off and on:
        drop = 1 - off["channel_max_abs"] / max(on["channel_max_abs"], 1e-9)
        sink_drop = on["sink_rate"] - off["sink_rate"]
        ok = drop > 0.9 and sink_drop > 0.1
        out["C2/C3"] = (f"{'supported' if ok else 'mixed' if drop > 0.9 else 'not supported'}: "
                        f"zeroing the super neuron shrinks the channel by {drop:.0%} and the sink "
                        f"rate at key 0 from {on['sink_rate']:.3f} to {off['sink_rate']:.3f}")
    out["C4"] = (f"{'supported' if moved else 'not supported'}: {len(moved)} of "
                 f"{len(result['move'])} (k, intervention) pairs at least double the sink at k "
                 "(to >= 0.1)")
    return out


def run(model: Any, *, model_name: str | None = None, n: int = 16, seq_len: int = 64,
        positions: Sequence[int] = (8, 16, 32),
        scales: Sequence[float] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0)) -> ExperimentResult:
    """Measure the four parts on ``n`` natural sequences of ``seq_len`` tokens (BOS first)."""
    tokens = make_prompts(model, "natural", "bos", n=n, seq_len=seq_len).tokens
    sn = dominant_super_neuron(model, tokens)
    data = {"schema": SCHEMA, "model": model_name or model.cfg.model_name, "n": n,
            "seq_len": seq_len, "inputs": "natural/bos (variance: random and natural, randfirst)",
            "variance": variance_part(model, n, seq_len), "super_neuron": sn,
            "dose_response": dose_response(model, tokens, sn, [float(s) for s in scales]),
            "move": move_the_sink(model, tokens, sn, list(positions))}
    data["channel_life"] = channel_life(sn["channel_at_pos0"])
    data["verdicts"] = verdicts(data)
    return ExperimentResult("structural_origin", data)


def summary(data: dict[str, Any]) -> str:
    """The Markdown summary: the super neuron, the channel's life, the tables, the verdicts."""
    sn = data["super_neuron"]
    lines = [f"# Structural origin of the sink on {data['model']}", "",
             f"Super neuron: layer {sn['layer']}, neuron {sn['neuron']} -> channel "
             f"{sn['channel']} (mean |input| at position 0: {sn['input_at_pos0']:.1f}).", "",
             "Channel at position 0, after each block (mean over the batch): "
             + "; ".join(f"{what} at layer {b['layer']} ({b['before']:.1f} -> {b['after']:.1f})"
                         for what, b in data["channel_life"].items() if b is not None) + ".",
             "",
             "| super-neuron scale | sink rate, key 0 | mean sink score, key 0 | "
             "max abs channel at pos 0 |", "|---|---|---|---|"]
    lines += [f"| {r['scale']} | {r['sink_rate']:.3f} | {r['sink_score']:.3f} | "
              f"{r['channel_max_abs']:.1f} |" for r in data["dose_response"]]
    lines += ["", "| k | intervention | sink at k before -> after | sink at 0 before -> after | "
              "max abs channel at k before -> after |", "|---|---|---|---|---|"]
    lines += [f"| {r['k']} | {r['intervention']} | {r['sink_at_k_before']:.3f} -> "
              f"{r['sink_at_k_after']:.3f} | {r['sink_at_0_before']:.3f} -> "
              f"{r['sink_at_0_after']:.3f} | {r['channel_at_k_before']:.1f} -> "
              f"{r['channel_at_k_after']:.1f} |" for r in data["move"]]
    lines += ["", *[f"- **{claim}**: {text}" for claim, text in data["verdicts"].items()],
              "", f"![structural origin]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_structural_origin

    return plot_structural_origin(data, path)
