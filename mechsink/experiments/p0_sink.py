"""The P0-sink circuit (Peng, Li et al. 2026, "How Attention Sinks Emerge in Large Language
Models: An Interpretability Perspective").

Claim: within the first blocks the model recognises position 0 from the causal mask alone and
writes a fixed high-norm state; it needs no BOS token. We measure:

1. the sink at key 0 and the massive channel at position 0 with BOS, without BOS, and with a
   random first token; the circuit below is traced with BOS unless the model has no sink
   behind one (then on the variant where its sink is strongest:
   :mod:`mechsink.interventions.first_token`);
2. path patching (mechsink.patching.path_patch, ``ablation="position_mean"``) from every
   early component's *position-0* output (each attention head and MLP of blocks
   0..``--layers``-1, by default through the block that creates the massive channel and at
   least the first 4, plus that block's top super neuron and its complete set as one sender):
   its output at position 0 is replaced by its mean over the later positions of the same
   sequence (what an ordinary position writes), and the change is followed
   (a) through the creating block's MLP into the massive channel at position 0,
   (b) through that MLP into the sink scores at key 0 of the later layers with the strongest
   sinks (a and b share each forward), and (c) directly (every other component frozen) into
   those sink scores; each path's effect is reported next to the channel it leaves;
3. the path *through the massive channel*, measured to saturation
   (:mod:`mechsink.interventions.chain`): the complete set's dose-response from full removal to 3x
   (its half-effect dose gives the channel value below which the sink gives way: a path patch that
   leaves the channel above it stops short), and channel surgery (the channel at position 0 set to
   its median over later positions after the creating block, one block or every block on), with 95%
   bootstrap intervals over prompts;
4. each component's total effect (the same ablation, nothing frozen) on the sink rate and on the
   channel, and the minimal circuit (mechsink.discover.node_search): the fewest components whose
   ablation brings the sink rate at key 0 down to half and whose preservation (every other
   candidate ablated) keeps 80% of it.

The circuit graph in result.json has a node per component plus the super neuron's MLP, the
massive channel and the sink, and an edge per measured path with its effect (clean minus
patched: positive means the component's position-0 output builds the target); a component
downstream of the super neuron's MLP has no edge through it (its effect there is null).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechsink.discover.node_search import minimal_circuit, single_effects
from mechsink.errors import BadInputError
from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult, verdict_lines
from mechsink.interventions import chain
from mechsink.interventions.edits import ablate
from mechsink.interventions.first_token import SINK_FLOOR, traced_prompts
from mechsink.interventions.readout import (
    massive_channel_sets,
    sink_readout,
    sink_readout_each,
)
from mechsink.patching import MassiveValue, SinkScore
from mechsink.patching.path import parse_component, path_patch

FIGURE = "p0_circuit.png"
SCHEMA = "mechsink-p0-sink/3"
SITES = {"head": "attn.hook_z", "mlp": "hook_mlp_out", "neuron": "mlp.hook_post"}


def _members(name: str) -> list[str]:
    """The path-patching components a node stands for: ``L11N1229+1487`` is a neuron set."""
    if "+" not in name:
        return [name]
    head, *rest = name.split("+")
    layer = parse_component(head).layer
    return [head, *(f"L{layer}N{n}" for n in rest)]


def component_edits(model, name: str) -> list:
    """Mean ablation at position 0 of a node (a component, or a neuron set)."""
    out = []
    for member in _members(name):
        c = parse_component(member)
        units = None if c.kind == "mlp" else [c.index]
        out.append(ablate(model, SITES[c.kind], c.layer, mode="position_mean", units=units,
                          positions=[0]))
    return out


def feeds_mlp(name: str, layer: int) -> bool:
    """Whether a node's output can reach MLP ``layer``'s input (it sits upstream of it;
    a neuron of that MLP counts, the MLP itself does not)."""
    c = parse_component(_members(name)[0])
    return c.layer < layer or (c.layer == layer and c.kind in ("head", "neuron"))


def sink_layers(scores, after: int, top: int = 3) -> list[int]:
    """The ``top`` layers after ``after`` whose mean sink score at key 0 is largest."""
    per_layer = scores.mean(-1).tolist()
    later = [lay for lay in range(len(per_layer)) if lay > after] or list(range(len(per_layer)))
    return sorted(sorted(later, key=lambda lay: -per_layer[lay])[:top])


def _channel_paths(model: Any, tokens: Any, channel: int, layer: int, units: list[int],
                   doses: Sequence[float], batch_size: int) -> dict[str, Any]:
    """The path *through the massive channel*, measured to saturation: the complete set's
    dose-response (the threshold), and channel surgery after the creating block (one block and
    every block on), each with the channel it leaves and 95% intervals over prompts."""
    dr = chain.dose_response(model, tokens, chain.neuron_set(model, layer, units,
                                                             channels=[channel]),
                             doses, batch_size=batch_size)
    after = min(layer + 1, int(model.cfg.n_layers) - 1)
    rows = [{"path": "clean", **dr.row(1.0).to_dict()},
            {"path": f"complete set L{layer} {units} removed (dose 0)", **dr.row(0.0).to_dict()}]
    for label, every in ((f"channel surgery, block {after} only", False),
                         (f"channel surgery, every block from {after}", True)):
        edits = chain.channel_surgery(model, [channel], after, every_layer_from=every)
        r = chain.measure(model, tokens, edits, channels=[channel], batch_size=batch_size)
        rows.append({"path": label, **chain.summarise(r, dr.frame).to_dict()})
    return {"dose_response": dr.to_dict(), "rows": rows, "surgery_layer": after}


def circuit_edges(components: list[str], path_effects: dict[str, dict[str, float | None]],
                  mlp_node: str, channel_node: str, sink_node: str) -> list[dict[str, Any]]:
    """One edge per measured path of each component (a null effect: no edge), with its effect
    and the metric it was read on."""
    paths = (("via_mlp_to_channel", channel_node, mlp_node, "massive_value"),
             ("via_mlp_to_sink", sink_node, mlp_node, "sink_score"),
             ("direct_to_sink", sink_node, None, "sink_score"))
    return [{"from": c, "to": to, "via": via, "metric": m, "effect": path_effects[k][c]}
            for c in components for k, to, via, m in paths if path_effects[k][c] is not None]


def run(model: Any, *, model_name: str | None = None, n: int = 8, seq_len: int = 32,
        layers: int | None = None, batch_size: int = 8,
        doses: Sequence[float] = chain.DEFAULT_DOSES) -> ExperimentResult:
    """Find the P0-sink circuit on ``n`` natural sequences of ``seq_len`` tokens.

    ``n``: natural sequences; ``seq_len``: tokens per sequence; ``layers``: candidate blocks
    0..layers-1 (default: through the block that creates the massive channel, at least 4);
    ``batch_size``: senders per path-patch batch; ``doses``: the complete set's dose grid (must
    include 0 and 1).
    """
    check_experiment_settings("p0_sink", locals())  # before any work, as the CLI does
    if layers is not None and layers > int(model.cfg.n_layers):  # never clamped silently
        raise BadInputError(f"p0_sink --layers {layers} is more than the model's "
                            f"{int(model.cfg.n_layers)} layers: give --layers "
                            f"{int(model.cfg.n_layers)} or fewer.")
    # traced where the model has its sink: BOS, unless it has no sink behind one
    variant, _, prompts = traced_prompts(model, n, seq_len)
    tokens = prompts[variant]
    found = massive_channel_sets(model, tokens)
    channel, sn_layer = found.channel, found.creating_layer
    units = found.sets[sn_layer].units
    set_name = f"L{sn_layer}N" + "+".join(str(u) for u in units)

    def measure(t, edits=()):
        r = sink_readout(model, t, list(edits), positions=[0], include_self=False,
                         channel=channel)
        return r.rates[0], r.channel_values[0].abs().max().item(), r.scores[0]

    plain = {v: measure(t) for v, t in prompts.items()}  # one forward per first-token variant
    first_token = {v: dict(zip(("sink_rate", "channel_max_abs"), m[:2], strict=True))
                   for v, m in plain.items()}
    targets = sink_layers(plain[variant][2], sn_layer)
    default_blocks = max(sn_layer + 1, 4)
    n_blocks = min(layers if layers is not None else default_blocks, model.cfg.n_layers)
    components = [f"L{lay}H{h}" for lay in range(n_blocks) for h in range(model.cfg.n_heads)]
    components += [f"MLP{lay}" for lay in range(n_blocks)]
    components.append(f"L{sn_layer}N{units[0]}")
    if len(units) > 1:
        components.append(set_name)

    # (2) path patching from each node's position-0 output; the two paths through the MLP
    # share every forward (two metrics per run)
    channel_metric = MassiveValue(sn_layer, 0, channel)
    sink_metric = (1 / len(targets)) * sum((SinkScore(lay) for lay in targets[1:]),
                                           SinkScore(targets[0]))
    senders = [[f"{m}@0" for m in _members(c)] for c in components]
    runs = {("via_mlp_to_channel", "via_mlp_to_sink"): ([channel_metric, sink_metric],
                                                         [f"MLP{sn_layer}"]),
            ("direct_to_sink",): ([sink_metric], ["metric"])}
    path_effects, clean_values = {}, {}
    for keys, (metrics, receivers) in runs.items():
        results = path_patch(model, tokens, None, senders, receivers, metrics,
                             ablation="position_mean", batch_size=batch_size)
        for key, res in zip(keys, results, strict=True):
            clean_values[key] = res.clean_value
            path_effects[key] = {  # None: the node is not upstream of the receiver
                c: res.clean_value - v if receivers == ["metric"] or feeds_mlp(c, sn_layer)
                else None for c, v in zip(components, res.values.tolist(), strict=True)}

    # (3) the path through the massive channel, to saturation
    through = _channel_paths(model, tokens, channel, sn_layer, units, doses, batch_size)
    threshold = through["dose_response"]["half_effect"]["channel"]

    # (4) total effects and the minimal circuit
    cache: dict[frozenset, tuple[float, float]] = {frozenset(): plain[variant][:2]}

    def evaluate_both(ablated: frozenset) -> tuple[float, float]:
        if ablated not in cache:
            cache[ablated] = measure(tokens, [e for c in ablated
                                              for e in component_edits(model, c)])[:2]
        return cache[ablated]

    # every component ablated alone, as stacked copies of the prompts (batched forwards)
    singles = [frozenset([c]) for c in components]
    for key, r in zip(singles, sink_readout_each(
            model, tokens, [[e for c in key for e in component_edits(model, c)]
                            for key in singles], positions=[0], include_self=False,
            channel=channel), strict=True):
        cache[key] = (r.rates[0], r.channel_values[0].abs().max().item())
    sink_effect = single_effects(components, lambda a: evaluate_both(a)[0])
    channel_effect = single_effects(components, lambda a: evaluate_both(a)[1])
    found_circuit = minimal_circuit(components, lambda a: evaluate_both(a)[0],
                                    effects=sink_effect)

    mlp_node, ch_node = f"MLP{sn_layer}", f"channel {channel} @0"
    sink_node = "sink @key0 (L" + ",".join(map(str, targets)) + ")"
    clean_channel = clean_values["via_mlp_to_channel"]

    def channel_after(c: str) -> float | None:
        e = path_effects["via_mlp_to_channel"][c]
        return None if e is None else clean_channel - e

    nodes = [{"name": c, "sink_rate_drop": sink_effect[c], "channel_drop": channel_effect[c],
              **{k: path_effects[k][c] for k in path_effects},
              "channel_after_patch": channel_after(c),
              "reaches_threshold": None if channel_after(c) is None or threshold is None
              else abs(channel_after(c)) <= abs(threshold),
              "in_circuit": c in found_circuit.members}
             for c in components]
    edges = circuit_edges(components, path_effects, mlp_node, ch_node, sink_node)
    data = {"schema": SCHEMA, "model": model_name or model.cfg.model_name, "n": n,
            "seq_len": seq_len, "traced_variant": variant,
            "ablation": "position_mean at position 0", "sink_layers": targets,
            "super_neuron": {"layer": sn_layer, "neuron": units[0], "channel": channel},
            "super_neuron_set": found.sets[sn_layer].to_dict(),
            "clean": clean_values, "first_token": first_token, "nodes": nodes,
            "edges": edges, "circuit": found_circuit.to_dict(),
            "through_channel": through}
    data["verdicts"] = verdicts(data)
    return ExperimentResult("p0_sink", data)


def _iv(d: dict[str, Any] | None) -> chain.Interval | None:
    return None if d is None else chain.Interval.from_dict(d)


def verdicts(data: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Each verdict with the criterion it was judged by and the figures it read."""
    out = {"no BOS needed": {
        "verdict": bos_verdict(data["first_token"]),
        "criterion": "supported if the sink rate at key 0 keeps at least half its largest "
                     "first-token value both without BOS and with a random first token "
                     f"(no sink to explain under {SINK_FLOOR})",
        "evidence": "; ".join(f"{v}: {m['sink_rate']:.3f}"
                              for v, m in data["first_token"].items())
        + f"; circuit traced on {data.get('traced_variant', 'bos')}"}}
    rows = data["through_channel"]["rows"]
    clean = _iv(rows[0]["late_sink_score"])
    for row in rows[1:]:
        after = _iv(row["late_sink_score"])
        if clean is None or after is None:
            continue
        apart = chain.apart(clean, after)
        verdict = (chain.TOO_FEW if apart is None else
                   "supported" if apart and after.mean < 0.5 * clean.mean else
                   "partial" if apart and after.mean < clean.mean else "not supported")
        ch = row["channel"]
        out[f"through the channel: {row['path']}"] = {
            "verdict": verdict,
            "criterion": "supported if this path's removal drops the late-layer sink score "
                         "below half its clean value with non-overlapping 95% intervals; "
                         "partial if apart but smaller; not called with fewer than "
                         f"{chain.MIN_N_APART} prompts",
            "evidence": f"late-layer sink score {clean} -> {after}; channel at position 0 "
                        f"{ch['mean']:.1f}" if ch else f"{clean} -> {after}"}
    half = data["through_channel"]["dose_response"]["half_effect"]
    if half["channel"] is not None:
        patched = [n for n in data["nodes"] if n["channel_after_patch"] is not None]
        reach = [n["name"] for n in patched if n["reaches_threshold"]]
        out["path patches reach the threshold"] = {
            "verdict": f"{len(reach)} of {len(patched)}",
            "criterion": "a path patch into the massive channel can only show the sink's "
                         "dependence if it leaves the channel at or below the half-effect "
                         f"channel value ({half['channel']:.1f}, dose {half['dose']:.3g})",
            "evidence": ", ".join(reach) or "none"}
    return out


def bos_verdict(first_token: dict, min_rate: float = SINK_FLOOR) -> str:
    """Supported when the sink keeps at least half its largest first-token rate without BOS and
    with a random first token; 'no sink' when there is nothing to explain (every rate under
    ``min_rate``). A model trained without BOS may have its sink only without one: the
    reference is the sink where it is strongest, not the BOS value."""
    top = max(m["sink_rate"] for m in first_token.values())
    if top < min_rate:
        return f"no sink to explain (largest first-token sink rate {top:.3f})"
    kept = all(first_token[v]["sink_rate"] >= 0.5 * top for v in ("nobos", "randfirst")
               if v in first_token)
    return "supported" if kept else "not supported"


def _cell(d: dict[str, Any] | None, spec: str = ".3f") -> str:
    if d is None:
        return "n/a"
    return f"{d['mean']:{spec}} [{d['low']:{spec}}, {d['high']:{spec}}]"


def summary(result: dict) -> str:
    """The Markdown summary: first-token variants, the path through the massive channel to
    saturation, the strongest path patches with the channel each leaves, the circuit, the
    verdicts with their criteria."""
    sn, clean = result["super_neuron"], result["clean"]
    sset = result["super_neuron_set"]
    members = ", ".join(f"{x['neuron']} ({x['share']:.2f})" for x in sset["neurons"])
    lines = [f"# P0-sink circuit on {result['model']}", "",
             f"Natural text, {result['n']} x {result['seq_len']} tokens, circuit traced on "
             f"{result.get('traced_variant', 'bos')}; massive channel "
             f"{sn['channel']}, created by MLP {sn['layer']}, whose complete set is {members} "
             f"({sset['explained']:.1%} of its write at position 0); sink layers "
             f"{result['sink_layers']}.", "",
             "| first token | sink rate at key 0 | max abs channel at pos 0 |", "|---|---|---|"]
    lines += [f"| {v} | {m['sink_rate']:.3f} | {m['channel_max_abs']:.1f} |"
              for v, m in result["first_token"].items()]
    through = result["through_channel"]
    half = through["dose_response"]["half_effect"]
    lines += ["", "Through the massive channel, to saturation (95% bootstrap intervals over "
              "prompts; late layers: after the creating block):", "",
              "| path removed | channel at pos 0 | late-layer sink score | sink rate | loss |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['path']} | {_cell(r['channel'], '.1f')} | {_cell(r['late_sink_score'])} | "
              f"{_cell(r['sink_rate'])} | {_cell(r['loss'], '.2f')} |" for r in through["rows"]]
    if half["dose"] is not None:
        lines += ["", f"The complete set's half-effect dose is {half['dose']:.3g}: the sink is "
                  f"half gone when the channel is down to {half['channel']:.1f} (clean "
                  f"{abs(through['rows'][0]['channel']['mean']):.1f})."]
    lines += ["", "Path patching, position-0 output replaced by its mean over later positions "
              f"(clean: channel {clean['via_mlp_to_channel']:.1f}, mean sink score "
              f"{clean['via_mlp_to_sink']:.3f}). Largest effects, each next to the channel it "
              "leaves (below the half-effect channel value: reaches the threshold):", "",
              "| node | via MLP -> channel | channel left | reaches threshold | via MLP -> sink | "
              "direct -> sink | total sink-rate drop | total channel drop |",
              "|---|---|---|---|---|---|---|---|"]
    top = sorted(result["nodes"], key=lambda n: -abs(n["via_mlp_to_channel"] or 0.0))[:6]
    top += sorted([n for n in result["nodes"] if n not in top],
                  key=lambda n: -abs(n["direct_to_sink"]))[:2]
    top += sorted([n for n in result["nodes"] if n not in top],
                  key=lambda n: -abs(n["sink_rate_drop"]))[:3]

    def fmt(x: float | None, spec: str) -> str:
        return "n/a" if x is None else format(x, spec)

    lines += [f"| {n['name']} | {fmt(n['via_mlp_to_channel'], '+.1f')} | "
              f"{fmt(n['channel_after_patch'], '.1f')} | "
              f"{'n/a' if n['reaches_threshold'] is None else n['reaches_threshold']} | "
              f"{fmt(n['via_mlp_to_sink'], '+.4f')} | {n['direct_to_sink']:+.4f} | "
              f"{n['sink_rate_drop']:+.3f} | {n['channel_drop']:+.1f} |" for n in top]
    lines += ["", "n/a: the node is not upstream of the creating block's MLP. "
              "A node `L<l>N<a>+<b>` is the complete set as one sender."]
    c = result["circuit"]
    lines += ["", f"Minimal circuit: {', '.join(c['members']) or '(none)'}. Sink rate "
              f"{c['baseline']:.3f}; with the circuit ablated {c['without_circuit']:.3f} "
              f"(removes: {c['removes']}); with every other candidate ablated "
              f"{c['circuit_only']:.3f} (preserves: {c['preserves']}).", ""]
    lines += verdict_lines(result["verdicts"])
    lines += ["", f"![P0 circuit]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_p0_circuit

    return plot_p0_circuit(data, path)
