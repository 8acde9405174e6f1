"""C5: the P0-sink circuit (seeds/004, "How Attention Sinks Emerge ... Interpretability").

Claim: within the first blocks the model recognises position 0 from the causal mask alone and
writes a fixed high-norm state; it needs no BOS token. We measure:

1. the sink at key 0 and the massive channel at position 0 with BOS, without BOS, and with a
   random first token;
2. the effect of each early component on both, by mean-ablating it at position 0 only (its
   output there replaced by its mean over the other positions): every attention head and MLP of
   the first ``--layers`` blocks, plus the dominant super neuron;
3. the minimal circuit (mechsink.circuit_search): the fewest components whose ablation removes
   the sink (sink rate at key 0 down to half) and whose preservation (every other candidate
   ablated) keeps it (at least 80%).

Edges in the saved graph are component -> target effects (direct and indirect together); they
are ablation effects, not component-to-component path-patching effects.

    python circuits/p0_sink.py --model smollm2-135m --out runs/p0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mechsink import load_model
from mechsink.assets import atomic_write_text
from mechsink.circuit_search import minimal_circuit, single_effects
from mechsink.interventions import ablate
from mechsink.probe import dominant_super_neuron, probe
from mechsink.prompts import make_prompts
from mechsink.viz.experiments import plot_p0_circuit

SCHEMA = "mechsink-p0-sink/1"


def component_edit(model, component: tuple):
    """Mean ablation at position 0 of ("head", l, h), ("mlp", l) or ("neuron", l, n)."""
    kind, layer, *unit = component
    site = {"head": "attn.hook_z", "mlp": "hook_mlp_out", "neuron": "mlp.hook_post"}[kind]
    return ablate(model, site, layer, mode="mean", units=unit or None, positions=[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2, help="candidate blocks: 0..layers-1")
    parser.add_argument("--seed", type=int, default=None, help="weights seed (random: models)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    model = load_model(args.model, device="cpu", seed=args.seed)
    prompts = {v: make_prompts(model, "natural", v, n=args.n, seq_len=args.seq_len).tokens
               for v in ("bos", "nobos", "randfirst")}
    sn = dominant_super_neuron(model, prompts["bos"])
    channel = sn["channel"]

    def measure(tokens, edits=()):
        r = probe(model, tokens, list(edits), key_positions=[0], channel=channel)
        return r.rates[0], r.channel_values[0].abs().max().item()

    first_token = {v: dict(zip(("sink_rate", "channel_max_abs"), measure(t), strict=True))
                   for v, t in prompts.items()}
    layers = range(min(args.layers, model.cfg.n_layers))
    components = [("head", lay, h) for lay in layers for h in range(model.cfg.n_heads)]
    components += [("mlp", lay) for lay in layers]
    components.append(("neuron", sn["layer"], sn["neuron"]))

    tokens = prompts["bos"]
    cache: dict[frozenset, tuple[float, float]] = {}

    def evaluate_both(ablated: frozenset) -> tuple[float, float]:
        if ablated not in cache:
            cache[ablated] = measure(tokens, [component_edit(model, c) for c in ablated])
        return cache[ablated]

    sink_effect = single_effects(components, lambda a: evaluate_both(a)[0])
    channel_effect = single_effects(components, lambda a: evaluate_both(a)[1])
    found = minimal_circuit(components, lambda a: evaluate_both(a)[0], effects=sink_effect)
    nodes = [{"component": list(c), "sink_rate_drop": sink_effect[c],
              "channel_drop": channel_effect[c], "in_circuit": c in found.members}
             for c in components]
    result = {"schema": SCHEMA, "model": args.model, "n": args.n, "seq_len": args.seq_len,
              "super_neuron": {k: sn[k] for k in ("layer", "neuron", "channel")},
              "first_token": first_token, "nodes": nodes,
              "edges": [{"from": n["component"], "to": target, "effect": n[key]}
                        for n in nodes for target, key in (("sink at key 0", "sink_rate_drop"),
                                                           (f"channel {channel} at pos 0",
                                                            "channel_drop"))],
              "circuit": found.to_dict()}
    atomic_write_text(args.out / "result.json", json.dumps(result, indent=1))
    plot_p0_circuit(result, args.out / "p0_circuit.png")

    lines = [f"# P0-sink circuit on {args.model}", "",
             f"Natural text, {args.n} x {args.seq_len} tokens; massive channel {channel} (super "
             f"neuron L{sn['layer']} N{sn['neuron']}).", "",
             "| first token | sink rate at key 0 | max |channel| at pos 0 |", "|---|---|---|"]
    lines += [f"| {v} | {m['sink_rate']:.3f} | {m['channel_max_abs']:.1f} |"
              for v, m in first_token.items()]
    top = sorted(nodes, key=lambda n: -n["sink_rate_drop"])[:8]
    lines += ["", "Largest single mean-ablation effects at position 0 (BOS input):", "",
              "| component | sink-rate drop | channel drop |", "|---|---|---|"]
    lines += [f"| {'/'.join(map(str, n['component']))} | {n['sink_rate_drop']:+.3f} | "
              f"{n['channel_drop']:+.1f} |" for n in top]
    c = found
    lines += ["", f"Minimal circuit: {', '.join('/'.join(map(str, m)) for m in c.members)}. "
              f"Sink rate {c.baseline:.3f}; with the circuit ablated {c.without_circuit:.3f} "
              f"(removes: {c.removes}); with every other candidate ablated {c.circuit_only:.3f} "
              f"(preserves: {c.preserves}).", "", "![P0 circuit](p0_circuit.png)", ""]
    atomic_write_text(args.out / "summary.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
