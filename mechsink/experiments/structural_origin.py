"""Why position 0 becomes the sink (Li, Jiang, Sun et al. 2026, "The Structural Origin of
Attention Sink: Variance Discrepancy, Super Neurons, and Dimension Disparity"; the causal mask's
self-concentration at position 0 and the value non-mixing it causes).

1. Variance discrepancy: variance over sequences of the attention output per position, and the
   uniform-mixing prediction sum_j A_tj^2 (1 at position 0).
2. Super neurons, complete: the massive channel at position 0, the block that creates it, and
   every block's complete set (the fewest neurons explaining >= 95% of its MLP's write there;
   Yu et al. 2024, "The Super Weight in Large Language Models").
3. Dose-response to saturation (:mod:`mechsink.interventions.chain`): the creating block's complete
   set (and every set that builds the channel, and the top neuron alone) scaled by factors 0..3 at
   position 0; per dose the channel, the late-layer sink score, Gu et al.'s sink rate and the loss
   with 95% bootstrap intervals over prompts, and the half-effect dose.
4. Channel surgery: the channel, or the top direction of position 0's residual, set to its
   median over later positions after the creating block (one block, or every block on).
5. Key-logit split of the three strongest sink heads: massive channel, rest, key bias, rotary.
6. Moving the sink to position k: (i) position k attends only to itself in every layer;
   (ii) token k's residual scaled up to position 0's norm at layer 1; (iii) the massive channel
   planted at k right after the creating block (position 0's value). Sink at k and at 0,
   and the channel at k, before and after.

Every verdict is read off a curve or a table and carries its criterion.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mechsink.experiments.result import ExperimentResult, verdict_lines
from mechsink.inputs.prompts import make_prompts
from mechsink.interventions import chain
from mechsink.interventions.edits import ablate, attend_only_to_self, scale_tokens
from mechsink.interventions.readout import massive_channel_sets, sink_readout
from mechsink.interventions.set_validation import validate_sets
from mechsink.measure.forward import measure_forward, of_cache
from mechsink.measure.variance import HOOKS as VARIANCE_HOOKS
from mechsink.measure.variance import variance_stats
from mechsink.model import act_name
from mechsink.settings import check_experiment_settings

FIGURE = "structural_origin.png"

SCHEMA = "mechsink-structural-origin/2"


def variance_part(model: Any, n: int, seq_len: int) -> dict:
    """The variance discrepancy and its uniform-mixing prediction on random and natural text
    (random first token), one forward each."""
    out = {}
    for suite in ("random", "natural"):
        tokens = make_prompts(model, suite, "randfirst", n=n, seq_len=seq_len, seed=0).tokens
        stats = measure_forward(model, tokens, {"variance": of_cache(VARIANCE_HOOKS,
                                                                     variance_stats)})["variance"]
        predicted = stats.predicted
        out[suite] = {"ratio": stats.ratio.tolist(),
                      "predicted_ratio": (predicted[:, 0] / predicted[:, 1:].mean(-1)).tolist()}
    return out


def move_the_sink(model, tokens, sn: dict, positions: list[int]) -> list[dict]:
    keys = [0, *positions]
    base = sink_readout(model, tokens, positions=keys, include_self=False, channel=sn["channel"])
    plant_layer = min(sn["layer"] + 1, model.cfg.n_layers - 1)  # after the creating block
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
            after = sink_readout(model, tokens, interventions, positions=[0, k],
                                 include_self=False, channel=sn["channel"])
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



# --- the causal chain, measured to saturation (mechsink.interventions.chain)


def _surgery(model: Any, tokens: Any, channel: int, layer: int, frame: chain.Frame,
             clean: chain.Readout, batch_size: int) -> list[dict[str, Any]]:
    """Clean, then the channel and the top direction of position 0 set to their median over
    later positions, in the input of ``layer`` only and of every block from ``layer`` on."""
    u = chain.top_direction(model, tokens, layer)
    conditions = {
        "clean": [],
        f"channel {channel}, block {layer} only": chain.channel_surgery(model, [channel], layer),
        f"channel {channel}, every block from {layer}": chain.channel_surgery(
            model, [channel], layer, every_layer_from=True),
        f"top direction of position 0, block {layer} only": chain.direction_surgery(
            model, u, layer),
        f"top direction of position 0, every block from {layer}": chain.direction_surgery(
            model, u, layer, every_layer_from=True),
    }
    rows = []
    for name, edits in conditions.items():
        r = clean if not edits else chain.measure(model, tokens, edits, channels=[channel],
                                                  batch_size=batch_size)
        rows.append({"condition": name, **chain.summarise(r, frame).to_dict()})
    rows[0]["direction_weight_on_channel"] = float(u[channel])
    return rows


def _strongest_sink_heads(clean: chain.Readout, frame: chain.Frame, k: int = 3) -> list[tuple]:
    mean = clean.scores.mean(0)
    late = [(lay, h) for lay, h in frame.sink_heads if lay in frame.late_layers] or list(
        frame.sink_heads)
    return sorted(late, key=lambda lh: -float(mean[lh]))[:k]


def run(model: Any, *, model_name: str | None = None, n: int = 16, seq_len: int = 64,
        positions: Sequence[int] = (8, 16, 32),
        doses: Sequence[float] = chain.DEFAULT_DOSES, batch_size: int = 8) -> ExperimentResult:
    """Measure the parts on ``n`` natural sequences of ``seq_len`` tokens (BOS first).

    ``n``: natural sequences; ``seq_len``: tokens per sequence; ``positions``: positions k the
    sink is moved to; ``doses``: the factors the complete super-neuron sets are scaled by
    (must include 0 and 1); ``batch_size``: sequences per forward.
    """
    check_experiment_settings("structural_origin", locals())  # before any work, as the CLI does
    grid = [float(d) for d in doses]
    tokens = make_prompts(model, "natural", "bos", n=n, seq_len=seq_len).tokens
    found = massive_channel_sets(model, tokens)
    channel, creating = found.channel, found.creating_layer
    sets = found.sets
    top = sets[creating].units[0]
    sn = {"layer": creating, "neuron": top, "channel": channel,
          "channel_at_pos0": found.channel_at_pos0,
          "median_abs_at_pos0": found.median_abs_at_pos0}

    def dose(target: chain.Target, grid_: Sequence[float]) -> chain.DoseResponse:
        return chain.dose_response(model, tokens, target, grid_, batch_size=batch_size)

    creating_dr = dose(chain.neuron_set(model, creating, sets[creating].units,
                                        channels=[channel]), grid)
    curves = {"creating_set": creating_dr.to_dict()}
    builders = found.builders
    if builders != [creating]:
        curves["all_builders"] = dose(chain.neuron_sets(
            model, {lay: sets[lay].units for lay in builders}, channels=[channel]),
            grid).to_dict()
    if len(sets[creating].units) > 1:
        curves["top_neuron_only"] = dose(chain.neuron_set(model, creating, [top],
                                                          channels=[channel]),
                                         [0.0, 1.0]).to_dict()
    named = [s for s in sets.values() if s.units]
    validation = (validate_sets(model, tokens, named, batch_size=batch_size).to_dict() if named
                  else {"not_applicable": "no block's complete set has a neuron"})
    clean = creating_dr.readouts[creating_dr.doses.index(1.0)]
    surgery_layer = min(creating + 1, int(model.cfg.n_layers) - 1)
    data = {"schema": SCHEMA, "model": model_name or model.cfg.model_name, "n": n,
            "seq_len": seq_len, "inputs": "natural/bos (variance: random and natural, randfirst)",
            "variance": variance_part(model, n, seq_len), "super_neuron": sn,
            "super_neuron_sets": {
                "channel": channel, "creating_layer": creating, "peak_layer": found.peak_layer,
                "builders": builders, "massive_channels": found.massive_channels,
                "sets": [s.to_dict() for s in sets.values()]},
            "set_validation": validation,
            "dose_response": curves,
            "surgery": {"layer": surgery_layer,
                        "rows": _surgery(model, tokens, channel, surgery_layer,
                                         creating_dr.frame, clean, batch_size)},
            "key_logits": [chain.key_logit_split(model, tokens, lay, h, [channel]).to_dict()
                           for lay, h in _strongest_sink_heads(clean, creating_dr.frame)],
            "move": move_the_sink(model, tokens, sn, list(positions))}
    data["channel_life"] = channel_life(sn["channel_at_pos0"])
    data["verdicts"] = verdicts(data)
    return ExperimentResult("structural_origin", data)


# --- verdicts: each from a curve, with its criterion ---------------------------------------


def _iv(d: dict[str, Any] | None) -> chain.Interval | None:
    return None if d is None else chain.Interval(d["mean"], d["low"], d["high"])


def _drop_verdict(clean: dict | None, removed: dict | None, what: str) -> tuple[str, str]:
    """'supported' when ``removed`` is below half of ``clean`` and their intervals do not
    overlap; 'partial' when the intervals are apart but the drop is smaller."""
    c, r = _iv(clean), _iv(removed)
    if c is None or r is None:
        return "not measured", f"no {what} to compare (no sink heads in the late layers)"
    apart = not c.overlaps(r)
    verdict = ("supported" if apart and r.mean < 0.5 * c.mean else
               "partial" if apart and r.mean < c.mean else "not supported")
    return verdict, f"{what} {c} clean -> {r} removed"


def verdicts(result: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Every verdict with the criterion it was judged by and the figures it read."""
    out: dict[str, dict[str, str]] = {}
    ratios = result["variance"]["random"]["ratio"]
    c1, later = ratios[0], statistics.median(ratios[1:])
    out["C1"] = {
        "verdict": "supported" if c1 > 1 else "not supported",
        "criterion": "supported if Var(attention output at position 0) / Var(positions > 0) "
                     "> 1 at layer 0 on random input",
        "evidence": f"ratio {c1:.2f} (uniform-mixing prediction "
                    f"{result['variance']['random']['predicted_ratio'][0]:.2f}); median over "
                    f"later layers {later:.2f}"}
    curves = result["dose_response"]
    main = curves["creating_set"]
    rows = {r["dose"]: r for r in main["rows"]}
    clean, off = rows[1.0], rows[0.0]
    sets = {s["layer"]: s for s in result["super_neuron_sets"]["sets"]}
    layer = result["super_neuron_sets"]["creating_layer"]
    units = [x["neuron"] for x in sets[layer]["neurons"]]
    ch_clean, ch_off = abs(clean["channel"]["mean"]), abs(off["channel"]["mean"])
    out["C2"] = {
        "verdict": "supported" if ch_off < 0.1 * ch_clean else "not supported",
        "criterion": "supported if scaling the complete super-neuron set of the block that "
                     "creates the massive channel to 0 (at position 0) leaves the channel below "
                     "10% of its clean value",
        "evidence": f"set {units} of MLP {layer} ({len(units)} neurons, "
                    f"{sets[layer]['explained']:.0%} of its write); channel "
                    f"{result['super_neuron_sets']['channel']} read after block "
                    f"{main['frame']['channel_layer']}: {ch_clean:.1f} clean -> {ch_off:.1f}"}
    if "set_validation" in result:
        out["C2, the set that carries the sink"] = carrier_verdict(result["set_validation"])
    verdict, ev = _drop_verdict(clean["late_sink_score"], off["late_sink_score"],
                                "late-layer sink score")
    _, ev_rate = _drop_verdict(clean["sink_rate"], off["sink_rate"], "sink rate")
    out["C3"] = {
        "verdict": verdict,
        "criterion": "supported if removing the complete set (factor 0) drops the late-layer "
                     "sink score below half its clean value with non-overlapping 95% intervals; "
                     "partial if the intervals are apart but the drop is smaller",
        "evidence": f"{ev}; {ev_rate}"}
    curve, curve_verdict = main, verdict
    builders = curves.get("all_builders")
    if builders:
        brows = {r["dose"]: r for r in builders["rows"]}
        b_verdict, b_ev = _drop_verdict(brows[1.0]["late_sink_score"],
                                        brows[0.0]["late_sink_score"], "late-layer sink score")
        out["C3, every building block"] = {
            "verdict": b_verdict,
            "criterion": "as C3, removing the complete sets of every block that writes the "
                         "channel up to its peak (where no single block creates it, this is "
                         "the complete intervention)",
            "evidence": f"{b_ev}; channel {abs(brows[1.0]['channel']['mean']):.1f} clean -> "
                        f"{abs(brows[0.0]['channel']['mean']):.1f}"}
        if verdict == "not supported" and b_verdict != "not supported":
            curve, curve_verdict = builders, b_verdict
    half = curve["half_effect"]
    if half["dose"] is not None and curve_verdict != "not supported":
        # a half-effect dose only means something on a curve whose full removal moves the sink
        out["saturation"] = {
            "verdict": "saturating" if half["dose"] < 0.5 else "graded",
            "criterion": "saturating if the sink is half gone only below dose 0.5 (the clean "
                         "channel is more than twice what the sink needs)",
            "evidence": f"{'every building block' if curve is builders else 'creating set'}: "
                        f"half-effect dose {half['dose']:.3g} (95% interval "
                        f"{half['dose_interval']}), channel there {half['channel']:.1f} vs "
                        f"{ch_clean:.1f} clean"}
    single = curves.get("top_neuron_only")
    if single:
        srow = {r["dose"]: r for r in single["rows"]}[0.0]
        out["one neuron"] = {
            "verdict": "stops short" if abs(srow["channel"]["mean"]) > (
                abs(half["channel"]) if half["channel"] is not None else 0.1 * ch_clean)
            else "enough",
            "criterion": "stops short if zeroing only the top neuron leaves the channel above "
                         "the half-effect channel value",
            "evidence": f"channel {abs(srow['channel']['mean']):.1f}, late-layer sink score "
                        f"{_iv(srow['late_sink_score'])}"}
    surgery = {r["condition"]: r for r in result["surgery"]["rows"]}
    every = next((r for name, r in surgery.items() if name.startswith("channel")
                  and "every" in name), None)
    if every is not None:
        v, ev = _drop_verdict(surgery["clean"]["late_sink_score"], every["late_sink_score"],
                              "late-layer sink score")
        out["channel carries the sink"] = {
            "verdict": v,
            "criterion": "supported if setting the massive channel at position 0 to its median "
                         "over later positions, in every block after the one that creates it, "
                         "drops the late-layer sink score below half with non-overlapping "
                         "intervals",
            "evidence": ev}
    out["C4"] = move_verdict(result["move"])
    return out


def carrier_verdict(validation: dict[str, Any]) -> dict[str, str]:
    """Which block's complete set carries the sink, from :func:`validate_sets`: supported when
    some set carries it (zeroing it halves the late-layer sink score, beyond a same-size random
    set of its block), partial when sets only move it."""
    from mechsink.interventions.set_validation import CRITERION

    if "not_applicable" in validation:
        return {"verdict": "not measured", "criterion": CRITERION,
                "evidence": validation["not_applicable"]}
    checks = validation["sets"]
    carrier = validation["carrier_block"]
    iv = lambda d: "n/a" if d is None else (  # noqa: E731
        f"{d['mean']:.3g} [{d['low']:.3g}, {d['high']:.3g}]")
    ch = str(checks[0]["channel"]) if checks else None
    clean = validation["clean"].get(ch, {}) if ch is not None else {}
    carrying = [c for c in checks if c["verdict"] == "carries the sink"]
    moving = [c for c in checks if c["verdict"] == "moves the sink"]
    verdict = "supported" if carrying else "partial" if moving else "not supported"
    best = next((c for c in checks if c["layer"] == carrier), None)
    evidence = (f"{len(carrying)} of {len(checks)} blocks' sets carry the sink, {len(moving)} "
                f"move it; clean late-layer sink score {iv(clean.get('late_sink_score'))}")
    if best is not None:
        evidence += (f"; carrier: block {carrier} ({best['size']} neurons): zeroed "
                     f"{iv(best['zeroed']['late_sink_score'])}, same-size random set "
                     f"{iv(best['random']['late_sink_score'])}, sink rate "
                     f"{iv(best['zeroed']['sink_rate'])} (clean {iv(clean.get('sink_rate'))})")
    else:
        evidence += "; no block's set lowers the sink beyond a random set of its block"
    return {"verdict": verdict, "criterion": CRITERION, "evidence": evidence,
            "carrier_block": "none" if carrier is None else str(carrier)}


def move_verdict(move: list[dict[str, Any]]) -> dict[str, str]:
    """C4 judged against the original sink, not against zero: the sink has moved when position
    k, after the intervention, holds at least half of what position 0 held before and at least
    as much as position 0 still holds; a rise at k that leaves position 0 the sink is partial."""
    moved = [r for r in move if r["sink_at_k_after"] >= 0.5 * r["sink_at_0_before"]
             and r["sink_at_k_after"] >= r["sink_at_0_after"]]
    rose = [r for r in move if r["sink_at_k_after"] >= max(0.1, 2 * r["sink_at_k_before"])]
    best = max(move, key=lambda r: r["sink_at_k_after"], default=None)
    evidence = (f"{len(moved)} of {len(move)} (k, intervention) pairs moved the sink, "
                f"{len(rose)} at least doubled the sink at k")
    if best is not None:
        evidence += (f"; strongest: k={best['k']} ({best['intervention']}) sink at k "
                     f"{best['sink_at_k_before']:.3f} -> {best['sink_at_k_after']:.3f}, at 0 "
                     f"{best['sink_at_0_before']:.3f} -> {best['sink_at_0_after']:.3f}")
    return {"verdict": "supported" if moved else "partial" if rose else "not supported",
            "criterion": "supported if some intervention leaves position k with at least half "
                         "the sink score position 0 had before and at least what position 0 "
                         "still has (the sink moved); partial if it only doubles the sink at k "
                         "(to >= 0.1) while position 0 stays the sink",
            "evidence": evidence}


# --- summary and figure ----------------------------------------------------------------------


def _cell(d: dict[str, Any] | None, spec: str = ".3f") -> str:
    if d is None:
        return "n/a"
    return f"{d['mean']:{spec}} [{d['low']:{spec}}, {d['high']:{spec}}]"


def dose_table(curve: dict[str, Any]) -> list[str]:
    """The dose-response as a Markdown table (intervals in brackets)."""
    lines = ["| dose | channel at pos 0 | late-layer sink score | sink rate | loss |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['dose']:g} | {_cell(r['channel'], '.1f')} | "
              f"{_cell(r['late_sink_score'])} | {_cell(r['sink_rate'])} | "
              f"{_cell(r['loss'], '.2f')} |" for r in curve["rows"]]
    return lines


def validation_table(validation: dict[str, Any] | None) -> list[str]:
    """Every set zeroed against a same-size random set of its block, as a Markdown table."""
    if not validation or "not_applicable" in validation:
        return []
    lines = ["", f"Every set zeroed at position 0, against a same-size random set of the same "
             f"block ({validation['n_prompts']} prompts; carrier: block "
             f"{validation['carrier_block']}):", "",
             "| block | size | channel zeroed | late sink zeroed | late sink random | "
             "sink rate zeroed | verdict |", "|---|---|---|---|---|---|---|"]
    for c in validation["sets"]:
        z, r = c["zeroed"], c["random"]
        lines.append(f"| {c['layer']} | {c['size']} | {_cell(z['channel'], '.1f')} | "
                     f"{_cell(z['late_sink_score'])} | {_cell(r['late_sink_score'])} | "
                     f"{_cell(z['sink_rate'])} | {c['verdict']} |")
    return lines


def summary(data: dict[str, Any]) -> str:
    """The Markdown summary: the complete sets, the channel's life, the curves, the surgery,
    the key logits, the sink moved, the verdicts with their criteria."""
    sets = data["super_neuron_sets"]
    channel, layer = sets["channel"], sets["creating_layer"]
    lines = [f"# Structural origin of the sink on {data['model']}", "",
             f"Natural text with BOS, {data['n']} x {data['seq_len']} tokens. Intervals: 95% "
             "bootstrap over prompts. Massive channel at position 0: "
             f"{channel}; created by block {layer}, peak after block {sets['peak_layer']}.", "",
             "Channel at position 0, after each block (mean over prompts): "
             + "; ".join(f"{what} at layer {b['layer']} ({b['before']:.1f} -> {b['after']:.1f})"
                         for what, b in data["channel_life"].items() if b is not None) + ".",
             "", "Complete super-neuron sets writing the channel at position 0 (>= 95% of each "
             "MLP's write):", "", "| block | write | set (neuron: share) | explained |",
             "|---|---|---|---|"]
    for s in sets["sets"]:
        members = ", ".join(f"{x['neuron']}: {x['share']:.2f}" for x in s["neurons"][:8])
        more = f" (+{s['size'] - 8} more)" if s["size"] > 8 else ""
        lines.append(f"| {s['layer']} | {s['write']:.1f} | {members}{more} | "
                     f"{s['explained']:.3f} |")
    lines += validation_table(data.get("set_validation"))
    for key, title in (("creating_set", f"the complete set of block {layer}"),
                       ("all_builders", f"every set building the channel (blocks "
                                        f"{sets['builders']})"),
                       ("top_neuron_only", "the top neuron only")):
        curve = data["dose_response"].get(key)
        if curve is None:
            continue
        f = curve["frame"]
        lines += ["", f"Dose-response of {title}: {curve['target']}. Late layers "
                  f"{f['late_layers'][0]}..{f['late_layers'][-1]}, "
                  f"{len(f['sink_heads'])} sink heads (clean score > {f['eps']}); channel read "
                  f"after block {f['channel_layer']}.", "", *dose_table(curve)]
        h = curve["half_effect"]
        if h["dose"] is not None:
            lines += ["", f"Half-effect dose {h['dose']:.3g} (interval {h['dose_interval']}): "
                      f"channel {h['channel']:.1f}; late-layer sink score clean {h['clean']:.3f}"
                      f", at full removal {h['floor']:.3f}."]
    lines += ["", f"Channel surgery (input of block {data['surgery']['layer']}, position 0 set "
              "to the median over positions 1..):", "",
              "| condition | channel at pos 0 | late-layer sink score | sink rate | loss |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['condition']} | {_cell(r['channel'], '.1f')} | "
              f"{_cell(r['late_sink_score'])} | {_cell(r['sink_rate'])} | "
              f"{_cell(r['loss'], '.2f')} |" for r in data["surgery"]["rows"]]
    lines += ["", f"Key-logit split of the strongest sink heads (channel {channel}; mean over "
              "queries i >= j; key j is the middle position):", "",
              "| head | key | massive | rest | key bias | rotary | total | model |",
              "|---|---|---|---|---|---|---|---|"]
    for s in data["key_logits"]:
        for key in ("key_0", "key_j"):
            p = s[key]
            lines.append(f"| L{s['layer']}H{s['head']} | {p['key']} | {p['massive']:.3f} | "
                         f"{p['rest']:.3f} | {p['key_bias']:.3f} | {p['rotary']:.3f} | "
                         f"{p['total']:.3f} | {p['model']:.3f} |")
    lines += ["", "| k | intervention | sink at k before -> after | sink at 0 before -> after | "
              "max abs channel at k before -> after |", "|---|---|---|---|---|"]
    lines += [f"| {r['k']} | {r['intervention']} | {r['sink_at_k_before']:.3f} -> "
              f"{r['sink_at_k_after']:.3f} | {r['sink_at_0_before']:.3f} -> "
              f"{r['sink_at_0_after']:.3f} | {r['channel_at_k_before']:.1f} -> "
              f"{r['channel_at_k_after']:.1f} |" for r in data["move"]]
    lines += ["", *verdict_lines(data["verdicts"])]
    lines += ["", f"![structural origin]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_structural_origin

    return plot_structural_origin(data, path)
