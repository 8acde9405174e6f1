"""The P0-sink circuit (Peng, Li et al. 2026, "How Attention Sinks Emerge in Large Language
Models: An Interpretability Perspective").

Claim: within the first blocks the model recognises position 0 from the causal mask alone and
writes a fixed high-norm state; it needs no BOS token. We measure:

1. the sink at key 0 and the massive channel at position 0 with BOS, without BOS, and with a
   random first token;
2. path patching (mechsink.patching.path_patch, ``ablation="position_mean"``) from every
   early component's *position-0* output (each attention head and MLP of blocks
   0..``--layers``-1, by default through the super neuron's block and at least the first 4,
   plus the dominant super neuron): its output at position 0 is replaced by its mean over
   the later positions of the same sequence (what an ordinary position writes), and the change
   is followed
   (a) through the super neuron's MLP into the massive channel at position 0,
   (b) through the super neuron's MLP into the sink scores at key 0 of the later layers with
   the strongest sinks, and (c) directly (every other component frozen) into those sink scores;
3. each component's total effect (the same ablation, nothing frozen) on the sink rate and on the
   channel, and the minimal circuit (mechsink.circuit_search): the fewest components whose
   ablation brings the sink rate at key 0 down to half and whose preservation (every other
   candidate ablated) keeps 80% of it.

The circuit graph in result.json has a node per component plus the super neuron's MLP, the
massive channel and the sink, and an edge per measured path with its effect (clean minus
patched: positive means the component's position-0 output builds the target); a component
downstream of the super neuron's MLP has no edge through it (its effect there is null).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mechsink.circuit_search import minimal_circuit, single_effects
from mechsink.experiments.result import ExperimentResult
from mechsink.interventions import ablate
from mechsink.patching import MassiveValue, SinkScore
from mechsink.patching.path import parse_component, path_patch
from mechsink.prompts import make_prompts
from mechsink.readout import dominant_super_neuron, sink_readout

FIGURE = "p0_circuit.png"
SCHEMA = "mechsink-p0-sink/2"
SITES = {"head": "attn.hook_z", "mlp": "hook_mlp_out", "neuron": "mlp.hook_post"}


def component_edit(model, name: str):
    """Mean ablation at position 0 of a component named as path patching names it."""
    c = parse_component(name)
    units = None if c.kind == "mlp" else [c.index]
    return ablate(model, SITES[c.kind], c.layer, mode="mean", units=units, positions=[0])


def feeds_mlp(name: str, layer: int) -> bool:
    """Whether a component's output can reach MLP ``layer``'s input (it sits upstream of it;
    a neuron of that MLP counts, the MLP itself does not)."""
    c = parse_component(name)
    return c.layer < layer or (c.layer == layer and c.kind in ("head", "neuron"))


def sink_layers(scores, after: int, top: int = 3) -> list[int]:
    """The ``top`` layers after ``after`` whose mean sink score at key 0 is largest."""
    per_layer = scores.mean(-1).tolist()
    later = [lay for lay in range(len(per_layer)) if lay > after] or list(range(len(per_layer)))
    return sorted(sorted(later, key=lambda lay: -per_layer[lay])[:top])


def run(model: Any, *, model_name: str | None = None, n: int = 8, seq_len: int = 32,
        layers: int | None = None, batch_size: int = 8) -> ExperimentResult:
    """Find the P0-sink circuit on ``n`` natural sequences of ``seq_len`` tokens.

    ``layers``: candidate blocks 0..layers-1 (default: through the super neuron's, at least 4);
    ``batch_size``: senders per path-patch batch.
    """
    prompts = {v: make_prompts(model, "natural", v, n=n, seq_len=seq_len).tokens
               for v in ("bos", "nobos", "randfirst")}
    tokens = prompts["bos"]
    sn = dominant_super_neuron(model, tokens)
    channel, sn_layer = sn["channel"], sn["layer"]

    def measure(t, edits=()):
        r = sink_readout(model, t, list(edits), key_positions=[0], channel=channel)
        return r.rates[0], r.channel_values[0].abs().max().item(), r.scores[0]

    plain = {v: measure(t) for v, t in prompts.items()}  # one forward per first-token variant
    first_token = {v: dict(zip(("sink_rate", "channel_max_abs"), m[:2], strict=True))
                   for v, m in plain.items()}
    targets = sink_layers(plain["bos"][2], sn_layer)
    default_blocks = max(sn_layer + 1, 4)
    n_blocks = min(layers if layers is not None else default_blocks, model.cfg.n_layers)
    components = [f"L{lay}H{h}" for lay in range(n_blocks) for h in range(model.cfg.n_heads)]
    components += [f"MLP{lay}" for lay in range(n_blocks)]
    components.append(f"L{sn_layer}N{sn['neuron']}")

    # (2) path patching from each component's position-0 output
    channel_metric = MassiveValue(sn_layer, 0, channel)
    sink_metric = (1 / len(targets)) * sum((SinkScore(lay) for lay in targets[1:]),
                                           SinkScore(targets[0]))
    senders = [f"{c}@0" for c in components]
    paths = {
        "via_mlp_to_channel": (channel_metric, [f"MLP{sn_layer}"]),
        "via_mlp_to_sink": (sink_metric, [f"MLP{sn_layer}"]),
        "direct_to_sink": (sink_metric, ["metric"]),
    }
    path_effects, clean_values = {}, {}
    for key, (metric, receivers) in paths.items():
        res = path_patch(model, tokens, None, senders, receivers, metric,
                         ablation="position_mean", batch_size=batch_size)
        clean_values[key] = res.clean_value
        path_effects[key] = {  # None: the component is not upstream of the receiver
            c: res.clean_value - v if receivers == ["metric"] or feeds_mlp(c, sn_layer) else None
            for c, v in zip(components, res.values.tolist(), strict=True)}

    # (3) total effects and the minimal circuit
    cache: dict[frozenset, tuple[float, float]] = {frozenset(): plain["bos"][:2]}

    def evaluate_both(ablated: frozenset) -> tuple[float, float]:
        if ablated not in cache:
            cache[ablated] = measure(tokens, [component_edit(model, c) for c in ablated])[:2]
        return cache[ablated]

    sink_effect = single_effects(components, lambda a: evaluate_both(a)[0])
    channel_effect = single_effects(components, lambda a: evaluate_both(a)[1])
    found = minimal_circuit(components, lambda a: evaluate_both(a)[0], effects=sink_effect)

    mlp_node, ch_node = f"MLP{sn_layer}", f"channel {channel} @0"
    sink_node = "sink @key0 (L" + ",".join(map(str, targets)) + ")"
    nodes = [{"name": c, "sink_rate_drop": sink_effect[c], "channel_drop": channel_effect[c],
              **{k: path_effects[k][c] for k in paths}, "in_circuit": c in found.members}
             for c in components]
    edges = [{"from": c, "to": to, "via": via, "metric": m, "effect": path_effects[k][c]}
             for c in components
             for k, to, via, m in (("via_mlp_to_channel", ch_node, mlp_node, "massive_value"),
                                   ("via_mlp_to_sink", sink_node, mlp_node, "sink_score"),
                                   ("direct_to_sink", sink_node, None, "sink_score"))
             if path_effects[k][c] is not None]
    data = {"schema": SCHEMA, "model": model_name or model.cfg.model_name, "n": n,
            "seq_len": seq_len,
            "ablation": "position_mean at position 0", "sink_layers": targets,
            "super_neuron": {k: sn[k] for k in ("layer", "neuron", "channel")},
            "clean": clean_values, "first_token": first_token, "nodes": nodes,
            "edges": edges, "circuit": found.to_dict()}
    return ExperimentResult("p0_sink", data)


def bos_verdict(first_token: dict, min_rate: float = 0.05) -> str:
    """Supported when the sink keeps at least half its BOS rate without BOS and with a random
    first token; 'no sink' when there is nothing to explain (BOS rate under ``min_rate``)."""
    bos = first_token["bos"]["sink_rate"]
    if bos < min_rate:
        return f"no sink to explain (sink rate with BOS {bos:.3f})"
    kept = min(m["sink_rate"] for m in first_token.values()) >= 0.5 * bos
    return "supported" if kept else "not supported"


def summary(result: dict) -> str:
    """The short markdown summary: first-token variants, the strongest paths, the circuit."""
    sn, clean = result["super_neuron"], result["clean"]
    lines = [f"# P0-sink circuit on {result['model']}", "",
             f"Natural text, {result['n']} x {result['seq_len']} tokens; massive channel "
             f"{sn['channel']} (super neuron L{sn['layer']} N{sn['neuron']}); sink layers "
             f"{result['sink_layers']}.", "",
             "| first token | sink rate at key 0 | max abs channel at pos 0 |", "|---|---|---|"]
    lines += [f"| {v} | {m['sink_rate']:.3f} | {m['channel_max_abs']:.1f} |"
              for v, m in result["first_token"].items()]
    lines += ["", f"No BOS needed: {bos_verdict(result['first_token'])}.", "",
              "Path patching, position-0 output replaced by its mean over later positions "
              f"(clean: channel {clean['via_mlp_to_channel']:.1f}, mean sink score "
              f"{clean['via_mlp_to_sink']:.3f}). Largest effects:", "",
              "| component | via MLP -> channel | via MLP -> sink | direct -> sink | "
              "total sink-rate drop | total channel drop |", "|---|---|---|---|---|---|"]
    top = sorted(result["nodes"], key=lambda n: -abs(n["via_mlp_to_channel"] or 0.0))[:6]
    top += sorted([n for n in result["nodes"] if n not in top],
                  key=lambda n: -abs(n["direct_to_sink"]))[:2]
    top += sorted([n for n in result["nodes"] if n not in top],
                  key=lambda n: -abs(n["sink_rate_drop"]))[:3]

    def fmt(x: float | None, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    lines += [f"| {n['name']} | {fmt(n['via_mlp_to_channel'], '+.1f')} | "
              f"{fmt(n['via_mlp_to_sink'], '+.4f')} | {n['direct_to_sink']:+.4f} | "
              f"{n['sink_rate_drop']:+.3f} | {n['channel_drop']:+.1f} |" for n in top]
    lines += ["", "n/a: the component is not upstream of the super neuron's MLP."]
    c = result["circuit"]
    lines += ["", f"Minimal circuit: {', '.join(c['members']) or '(none)'}. Sink rate "
              f"{c['baseline']:.3f}; with the circuit ablated {c['without_circuit']:.3f} "
              f"(removes: {c['removes']}); with every other candidate ablated "
              f"{c['circuit_only']:.3f} (preserves: {c['preserves']}).", "",
              f"![P0 circuit]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_p0_circuit

    return plot_p0_circuit(data, path)
