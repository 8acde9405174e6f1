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
   with 95% intervals over prompts (Student's t below 64 prompts), and the half-effect dose.
4. Channel surgery: the channel, or the top direction of position 0's residual, set to its
   median over later positions after the creating block (one block, or every block on).
5. Key-logit split of the three strongest sink heads: massive channel, rest, key bias, rotary.
6. Moving the sink to position k (C4), every intervention as a dose-response up to saturation
   at each k (:data:`INTERVENTIONS`): (i) the self-only mask, dosed by the share of isolation
   (the query's attention row mixed toward one-hot on itself, in every layer); (ii) the
   variance of token k amplified as the paper defines it (its deviation from the mean over
   sequences at k multiplied by a factor, entering block 1), with the earlier readings kept as
   named variants (the norm amplified: x_k times a factor; the massive channel planted at k as
   a multiple of position 0's value); and the mask and the variance together. Per dose the
   sink at k and at 0 with intervals over prompts, judged on paired intervals against the
   original sink at 0.

Every verdict is read off a curve or a table and carries its criterion. Parts 2-6 run with BOS
first, unless the model has no sink behind BOS (then without it, or with a random first token,
where its sink is strongest: :mod:`mechsink.interventions.first_token`).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mechsink.errors import BadInputError
from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult, verdict_lines
from mechsink.inputs.prompts import make_prompts
from mechsink.interventions import chain
from mechsink.interventions.dose import late_values
from mechsink.interventions.edits import (
    ablate,
    amplify_deviation,
    attend_only_to_self,
    scale_tokens,
)
from mechsink.interventions.first_token import traced_prompts
from mechsink.interventions.readout import (
    massive_channel_sets,
    measure_each,
    read_with_edits,
    resid_at,
)
from mechsink.interventions.set_validation import validate_sets
from mechsink.interventions.stacked import read_each
from mechsink.interventions.stats import interval_text as chain_text
from mechsink.measure import sink_scores
from mechsink.measure.cache import StackedCache, stacked
from mechsink.measure.forward import Forward, Measurement, measure_forward, of_cache
from mechsink.measure.sinks import DEFAULT_EPS
from mechsink.measure.sinks import HOOKS as PATTERN_HOOKS
from mechsink.measure.variance import HOOKS as VARIANCE_HOOKS
from mechsink.measure.variance import VarianceStats, variance_stats
from mechsink.model import act_name

FIGURE = "structural_origin.png"

SCHEMA = "mechsink-structural-origin/3"  # /3: intervals with method and n, C4 dosed


def variance_part(model: Any, n: int, seq_len: int) -> dict:
    """The variance discrepancy and its uniform-mixing prediction on random and natural text
    (random first token), both suites in one batched run (each suite's sums over its own
    rows)."""
    from mechsink.interventions.stacked import SPEEDUPS

    suites = ("random", "natural")
    made = [make_prompts(model, suite, "randfirst", n=n, seq_len=seq_len, seed=0).tokens
            for suite in suites]
    if SPEEDUPS["stacked"] and len({tuple(t.shape) for t in made}) == 1:
        bounds = [(i * n, (i + 1) * n) for i in range(len(suites))]
        wanted = {suite: _rows_variance(lo, hi) for suite, (lo, hi) in zip(suites, bounds,
                                                                           strict=True)}
        got = measure_forward(model, torch.cat(made), wanted)
    else:
        got = {suite: measure_forward(model, tokens, {"variance": of_cache(
            VARIANCE_HOOKS, variance_stats)})["variance"] for suite, tokens in zip(
            suites, made, strict=True)}
    out = {}
    for suite in suites:
        stats = got[suite]
        predicted = stats.predicted
        out[suite] = {"ratio": stats.ratio.tolist(),
                      "predicted_ratio": (predicted[:, 0] / predicted[:, 1:].mean(-1)).tolist()}
    return out


def _rows_variance(lo: int, hi: int) -> Measurement:
    """:func:`variance_stats` of the stacked rows ``lo:hi`` only (chunks merge their sums)."""

    def read(forward: Forward) -> Any:
        a = max(lo, forward.start) - forward.start
        b = min(hi, forward.start + int(forward.tokens.shape[0])) - forward.start
        if a >= b:
            return None
        cache = forward.cache
        rows = StackedCache({h: stacked(cache, h)[:, a:b] for h in VARIANCE_HOOKS}, {})
        return variance_stats(rows)

    def merge(parts: Sequence[Any]) -> Any:
        return VarianceStats.merge([p for p in parts if p is not None])

    return Measurement(VARIANCE_HOOKS, read, merge)


# --- C4: moving the sink to position k, each intervention as a dose-response -----------------

MASK_STRENGTHS: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)
# SmolLM2-135M: the sink at k stops rising by a factor of 1024
AMPLIFY_FACTORS: tuple[float, ...] = (4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0)
PLANT_FACTORS: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, 4.0)
AMPLIFY_LAYER = 1  # the residual entering block 1: after the first attention has mixed values
SATURATED_STEP = 0.02  # a curve is saturated when its last dose step moves the sink by less

INTERVENTIONS = {
    "self-only mask": "strength s: query k's attention row becomes (1 - s) its own + s one-hot "
                      "on k, in every layer (s = 1: k sees only itself, as position 0 does)",
    "variance amplified": "factor a: x_k <- m_k + a (x_k - m_k), m_k the mean over sequences at "
                          f"k, in the residual entering block {AMPLIFY_LAYER} (the variance "
                          "over sequences at k times a^2)",
    "norm amplified": f"factor a: x_k <- a x_k in the residual entering block {AMPLIFY_LAYER}",
    "channel planted": "factor f: the massive channel at k set to f x position 0's mean value "
                       "there, in the residual entering the block after the creating one",
    "mask + variance": "the self-only mask at s = 1 and the variance amplified by a",
}


def _move_wanted(model: Any, keys: Sequence[int], channel: int, eps: float
                 ) -> dict[str, Any]:
    """What one C4 run reads: the sink scores at each key and the channel there."""
    n_layers = int(model.cfg.n_layers)
    wanted = {}
    for k in keys:
        wanted[f"s{k}"] = of_cache(PATTERN_HOOKS, lambda c, k=k: sink_scores(c, k, eps))
        wanted[f"c{k}"] = resid_at(n_layers, k, channel)
    return wanted


def _move_values(got: dict[str, Any], keys: Sequence[int], eps: float
                 ) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for k in keys:
        per = got[f"s{k}"].per_sequence(False).double()
        out[k] = {"score": per.mean((1, 2)), "rate": float((per > eps).double().mean()),
                  "channel": float(got[f"c{k}"].double().mean(0).abs().max())}
    return out


def _move_read(model: Any, tokens: Any, edits: list, keys: Sequence[int], channel: int,
               batch_size: int, eps: float) -> dict[int, dict[str, Any]]:
    """One run with ``edits``: per prompt, the sink score at each key (queries after it, mean
    over every layer and head), Gu's sink rate there, and the channel at each key after every
    block (mean over prompts)."""
    got = read_with_edits(model, tokens, _move_wanted(model, keys, channel, eps), edits,
                          batch_size=batch_size)
    return _move_values(got, keys, eps)


def _move_row(k: int, name: str, dose: float, base: dict, after: dict) -> dict[str, Any]:
    """One (k, intervention, dose): means as before, and their intervals: each figure's, and
    the paired ones the criterion reads (the sink at k after against half the original sink at
    0, against what 0 keeps, and against k before)."""
    k_after, zero_after = after[k]["score"], after[0]["score"]
    k_before, zero_before = base[k]["score"], base[0]["score"]
    iv = {"sink_at_k_before": chain.mean_interval(k_before),
          "sink_at_k_after": chain.mean_interval(k_after),
          "sink_at_0_before": chain.mean_interval(zero_before),
          "sink_at_0_after": chain.mean_interval(zero_after),
          "k_over_half_original": chain.paired_interval(k_after, 0.5 * zero_before),
          "k_over_0_after": chain.paired_interval(k_after, zero_after),
          "rise_at_k": chain.paired_interval(k_after, k_before)}
    ok = iv["k_over_half_original"].callable
    moved = None if not ok else bool(iv["k_over_half_original"].low > 0
                                      and iv["k_over_0_after"].low > 0)
    rose = None if not ok else bool(iv["rise_at_k"].low > 0 and float(k_after.mean())
                                     >= max(0.1, 2 * float(k_before.mean())))
    return {"k": k, "intervention": name, "dose": dose,
            "sink_at_k_before": float(k_before.mean()), "sink_at_k_after": float(k_after.mean()),
            "rate_at_k_after": after[k]["rate"],
            "sink_at_0_before": float(zero_before.mean()),
            "sink_at_0_after": float(zero_after.mean()),
            "channel_at_k_before": base[k]["channel"], "channel_at_k_after": after[k]["channel"],
            "intervals": {key: v.to_dict() for key, v in iv.items()},
            "moved": moved, "rose": rose}


def _curve(k: int, name: str, doses: Sequence[float], scores: list) -> dict[str, Any]:
    """Where one dose-response of the sink at k ends: its last step (paired over prompts),
    whether it saturated there, and whether the grid reached the intervention's largest dose
    (the mask's strength 1: full isolation; the factors have none)."""
    means = [float(v.mean()) for v in scores]
    step = chain.paired_interval(scores[-1], scores[-2]) if len(scores) > 1 else None
    return {"k": k, "intervention": name, "doses": [float(d) for d in doses],
            "sink_at_k": means, "last_step": None if step is None else step.to_dict(),
            "saturated": None if step is None else abs(step.mean) < SATURATED_STEP,
            "full_dose": name == "self-only mask" and float(max(doses)) == 1.0}


def move_the_sink(model: Any, tokens: Any, sn: dict, positions: list[int], *,
                  mask_strengths: Sequence[float] = MASK_STRENGTHS,
                  amplify_factors: Sequence[float] = AMPLIFY_FACTORS,
                  plant_factors: Sequence[float] = PLANT_FACTORS, batch_size: int = 8,
                  eps: float = DEFAULT_EPS) -> tuple[list[dict], list[dict]]:
    """C4: each intervention of :data:`INTERVENTIONS` at each of its doses and each position
    k, read per prompt against the clean run. Returns the rows (one per k, intervention,
    dose) and the curves (one per k and intervention: saturated or not)."""
    channel = sn["channel"]
    n_layers = int(model.cfg.n_layers)
    keys = [0, *positions]
    base = _move_read(model, tokens, [], keys, channel, batch_size, eps)
    layer = min(AMPLIFY_LAYER, n_layers - 1)
    plant_layer = min(sn["layer"] + 1, n_layers - 1)  # after the creating block
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda h: h in (
            act_name("resid_pre", layer), act_name("resid_pre", plant_layer)))
    resid = cache[act_name("resid_pre", layer)].double()
    centers = resid.mean(0)  # [pos, d_model]: mean over sequences, fixed on every prompt
    massive = cache[act_name("resid_pre", plant_layer)][:, 0, channel].double().mean().item()
    del cache, resid
    all_layers = range(n_layers)
    plan = []  # (k, intervention, doses, edit lists): every dose of every k, read at once
    for k in positions:
        grids = {
            "self-only mask": (mask_strengths, lambda s, k=k: attend_only_to_self(
                model, all_layers, k, strength=s)),
            "variance amplified": (amplify_factors, lambda a, k=k: [amplify_deviation(
                model, layer, [k], a, centers[k:k + 1])]),
            "norm amplified": (amplify_factors, lambda a, k=k: [scale_tokens(model, layer, [k],
                                                                             a)]),
            "channel planted": (plant_factors, lambda f, k=k: [ablate(
                model, "hook_resid_pre", plant_layer, mode="set", value=f * massive,
                units=[channel], positions=[k])]),
            "mask + variance": (amplify_factors, lambda a, k=k: [
                *attend_only_to_self(model, all_layers, k),
                amplify_deviation(model, layer, [k], a, centers[k:k + 1])]),
        }
        for name, (doses, make) in grids.items():
            plan.append((k, name, doses, [make(float(dose)) for dose in doses]))
    # the doses as stacked copies of the prompts: batched forwards, each copy with its edits
    # (every key read on every copy: the keys a copy does not need cost a few reductions)
    got = iter(read_each(model, tokens, _move_wanted(model, keys, channel, eps),
                         [e for *_, lists in plan for e in lists], batch_size=batch_size))
    rows, curves = [], []
    for k, name, doses, lists in plan:
        scores = []
        for dose, _ in zip(doses, lists, strict=True):
            after = _move_values(next(got), [0, k], eps)
            rows.append(_move_row(k, name, float(dose), base, after))
            scores.append(after[k]["score"])
        curves.append(_curve(k, name, doses, scores))
    return rows, curves


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
    base = late_values(clean, frame)
    edited = [name for name, edits in conditions.items() if edits]
    runs = dict(zip(edited, measure_each(model, tokens, [conditions[e] for e in edited],
                                         channels=[channel], batch_size=batch_size),
                    strict=True))  # the conditions as stacked copies: batched forwards
    for name, edits in conditions.items():
        r = runs.get(name, clean)
        after = late_values(r, frame)
        drop = None if base is None or after is None or not edits else \
            chain.paired_interval(base, after).to_dict()
        rows.append({"condition": name, **chain.summarise(r, frame).to_dict(), "drop": drop})
    rows[0]["direction_weight_on_channel"] = float(u[channel])
    return rows


def _strongest_sink_heads(clean: chain.Readout, frame: chain.Frame, k: int = 3) -> list[tuple]:
    mean = clean.scores.mean(0)
    late = [(lay, h) for lay, h in frame.sink_heads if lay in frame.late_layers] or list(
        frame.sink_heads)
    return sorted(late, key=lambda lh: -float(mean[lh]))[:k]


def run(model: Any, *, model_name: str | None = None, n: int = 16, seq_len: int = 64,
        positions: Sequence[int] = (4, 8, 32),
        doses: Sequence[float] = chain.DEFAULT_DOSES,
        mask_strengths: Sequence[float] = MASK_STRENGTHS,
        amplify_factors: Sequence[float] = AMPLIFY_FACTORS,
        plant_factors: Sequence[float] = PLANT_FACTORS,
        batch_size: int = 8) -> ExperimentResult:
    """Measure the parts on ``n`` natural sequences of ``seq_len`` tokens (BOS first, unless the
    model has no sink behind BOS: :mod:`mechsink.interventions.first_token`).

    ``n``: natural sequences; ``seq_len``: tokens per sequence; ``positions``: positions k the
    sink is moved to; ``doses``: the factors the complete super-neuron sets are scaled by
    (must include 0 and 1); ``mask_strengths``: the self-only mask's strengths in [0, 1];
    ``amplify_factors``: the factors of the variance and norm amplifications;
    ``plant_factors``: the planted channel's value as multiples of position 0's;
    ``batch_size``: sequences per forward.
    """
    check_experiment_settings("structural_origin", locals())  # before any work, as the CLI does
    if any(not 0.0 < float(x) <= 1.0 for x in mask_strengths):
        raise BadInputError(f"mask_strengths must lie in (0, 1] (1: position k sees only "
                            f"itself), got {list(mask_strengths)}.")
    if min(len(mask_strengths), len(amplify_factors), len(plant_factors)) < 1:
        raise BadInputError("mask_strengths, amplify_factors and plant_factors need at least "
                            "one dose each.")
    grid = [float(d) for d in doses]
    # traced where the model has its sink: BOS, unless it has no sink behind one
    variant, rates, prompts = traced_prompts(model, n, seq_len)
    tokens = prompts[variant]
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
            "seq_len": seq_len,
            "inputs": f"natural/{variant} (variance: random and natural, randfirst)",
            "traced_variant": variant, "first_token_sink_rates": rates,
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
            "move_interventions": INTERVENTIONS}
    data["move"], data["move_curves"] = move_the_sink(
        model, tokens, sn, list(positions), mask_strengths=mask_strengths,
        amplify_factors=amplify_factors, plant_factors=plant_factors, batch_size=batch_size)
    data["channel_life"] = channel_life(sn["channel_at_pos0"])
    data["verdicts"] = verdicts(data)
    return ExperimentResult("structural_origin", data)


# --- verdicts: each from a curve, with its criterion ---------------------------------------


def _iv(d: dict[str, Any] | None) -> chain.Interval | None:
    return None if d is None else chain.Interval.from_dict(d)


def _drop_verdict(clean: dict | None, removed: dict | None, what: str,
                  drop: dict | None = None) -> tuple[str, str]:
    """'supported' when ``removed`` is below half of ``clean`` and the removal is resolved:
    the paired interval of the per-prompt drop (clean - removed) above 0 where it was
    recorded, else the two intervals apart; 'partial' when resolved but the drop is smaller;
    'too few prompts to call' below :data:`~mechsink.interventions.stats.MIN_N_APART`."""
    c, r = _iv(clean), _iv(removed)
    if c is None or r is None:
        return "not measured", f"no {what} to compare (no sink heads in the late layers)"
    d = _iv(drop)
    evidence = f"{what} {c} clean -> {r} removed" + (
        "" if d is None else f", paired drop {d}")
    resolved = chain.apart(c, r) if d is None else (d.low > 0 if d.callable else None)
    if resolved is None:
        return chain.TOO_FEW, evidence
    verdict = ("supported" if resolved and r.mean < 0.5 * c.mean else
               "partial" if resolved and r.mean < c.mean else "not supported")
    return verdict, evidence


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
                                "late-layer sink score", main["half_effect"].get("drop"))
    _, ev_rate = _drop_verdict(clean["sink_rate"], off["sink_rate"], "sink rate")
    out["C3"] = {
        "verdict": verdict,
        "criterion": "supported if removing the complete set (factor 0) drops the late-layer "
                     "sink score below half its clean value and the paired 95% interval of the "
                     "per-prompt drop excludes 0; partial if it excludes 0 but the drop is "
                     f"smaller; not called with fewer than {chain.MIN_N_APART} prompts",
        "evidence": f"{ev}; {ev_rate}"}
    curve, curve_verdict = main, verdict
    builders = curves.get("all_builders")
    if builders:
        brows = {r["dose"]: r for r in builders["rows"]}
        b_verdict, b_ev = _drop_verdict(brows[1.0]["late_sink_score"],
                                        brows[0.0]["late_sink_score"], "late-layer sink score",
                                        builders["half_effect"].get("drop"))
        out["C3, every building block"] = {
            "verdict": b_verdict,
            "criterion": "as C3, removing the complete sets of every block that writes the "
                         "channel up to its peak (where no single block creates it, this is "
                         "the complete intervention)",
            "evidence": f"{b_ev}; channel {abs(brows[1.0]['channel']['mean']):.1f} clean -> "
                        f"{abs(brows[0.0]['channel']['mean']):.1f}"}
        if verdict == "not supported" and b_verdict not in ("not supported", chain.TOO_FEW):
            curve, curve_verdict = builders, b_verdict
    half = curve["half_effect"]
    if half["dose"] is not None and curve_verdict in ("supported", "partial"):
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
                              "late-layer sink score", every.get("drop"))
        out["channel carries the sink"] = {
            "verdict": v,
            "criterion": "supported if setting the massive channel at position 0 to its median "
                         "over later positions, in every block after the one that creates it, "
                         "drops the late-layer sink score below half with non-overlapping "
                         "intervals",
            "evidence": ev}
    out["C4"] = move_verdict(result["move"], result.get("move_curves"))
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
    iv = lambda d: chain_text(d, ".3g")  # noqa: E731
    ch = str(checks[0]["channel"]) if checks else None
    clean = validation["clean"].get(ch, {}) if ch is not None else {}
    carrying = [c for c in checks if c["verdict"] == "carries the sink"]
    moving = [c for c in checks if c["verdict"] == "moves the sink"]
    too_few = bool(checks) and all(c["verdict"].startswith(chain.TOO_FEW) for c in checks)
    verdict = ("supported" if carrying else "partial" if moving else
               chain.TOO_FEW if too_few else "not supported")
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


MOVE_CRITERION = (
    "supported if at some position k some intervention, at some dose, leaves k with a sink "
    "score (queries after k, mean over layers and heads) whose paired 95% interval over prompts "
    "lies above half the score position 0 had before and above what position 0 still holds "
    "(the sink moved); partial if it only resolves a rise at k to at least twice its clean "
    "value (and >= 0.1) while position 0 stays the sink; every intervention dosed up to "
    f"saturation (a curve is saturated when its last dose step moves the sink at k by less "
    f"than {SATURATED_STEP}); not called with fewer than {chain.MIN_N_APART} prompts")


def _dosed_move_verdict(move: list[dict[str, Any]], curves: list[dict[str, Any]]
                        ) -> dict[str, str]:
    moved = [r for r in move if r.get("moved")]
    rose = [r for r in move if r.get("rose")]
    n = move[0]["intervals"]["sink_at_k_after"].get("n")
    if all(r.get("moved") is None for r in move):
        verdict = chain.TOO_FEW
    else:
        verdict = "supported" if moved else "partial" if rose else "not supported"
    parts = [f"n={n} prompts; {len(moved)} of {len(move)} (k, intervention, dose) moved the "
             f"sink, {len(rose)} resolved a rise at k"]
    for name in dict.fromkeys(r["intervention"] for r in move):
        mine = [r for r in move if r["intervention"] == name]
        best = max(mine, key=lambda r: r["sink_at_k_after"])
        iv = best["intervals"]
        ks = sorted({r["k"] for r in mine if r.get("moved")})
        parts.append(f"{name}: moved at k={ks or 'none'}; strongest k={best['k']} dose "
                     f"{best['dose']:g}: sink at k {chain_text(iv['sink_at_k_before'])} -> "
                     f"{chain_text(iv['sink_at_k_after'])}, at 0 "
                     f"{chain_text(iv['sink_at_0_before'])} -> "
                     f"{chain_text(iv['sink_at_0_after'])}")
    if curves:
        sat = [c for c in curves if c.get("saturated")]
        full = [c for c in curves if c.get("full_dose") and not c.get("saturated")]
        parts.append(f"{len(sat)} of {len(curves)} curves saturated" + (
            f", {len(full)} more at full isolation (the mask's largest dose)" if full else ""))
    return {"verdict": verdict, "criterion": MOVE_CRITERION, "evidence": "; ".join(parts)}


def move_verdict(move: list[dict[str, Any]], curves: list[dict[str, Any]] | None = None
                 ) -> dict[str, str]:
    """C4 judged against the original sink, not against zero: the sink has moved when position
    k, after the intervention, holds at least half of what position 0 held before and at least
    as much as position 0 still holds; a rise at k that leaves position 0 the sink is partial.
    Rows with intervals (every dose of every intervention) are judged on the paired intervals
    (:data:`MOVE_CRITERION`); rows without (results written before) on the means."""
    if move and all("intervals" in r for r in move):
        return _dosed_move_verdict(move, curves or [])
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
    return chain_text(d, spec)


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


def _saturation(curve: dict[str, Any]) -> str:
    if curve.get("full_dose") and not curve["saturated"]:
        return "at full isolation"
    return "yes" if curve["saturated"] else "no"


def move_table(data: dict[str, Any]) -> list[str]:
    """C4 as a Markdown table: k x intervention x dose -> the sink at k and at 0 with their
    intervals, and whether the sink moved (results written before the doses: one row per k
    and intervention, means only)."""
    move = data["move"]
    if not move or "intervals" not in move[0]:
        return ["", "| k | intervention | sink at k before -> after | sink at 0 before -> "
                "after | max abs channel at k before -> after |", "|---|---|---|---|---|",
                *[f"| {r['k']} | {r['intervention']} | {r['sink_at_k_before']:.3f} -> "
                  f"{r['sink_at_k_after']:.3f} | {r['sink_at_0_before']:.3f} -> "
                  f"{r['sink_at_0_after']:.3f} | {r['channel_at_k_before']:.1f} -> "
                  f"{r['channel_at_k_after']:.1f} |" for r in move]]
    first = move[0]["intervals"]
    lines = ["", "Moving the sink to position k (sink score of queries after the key, mean over "
             "every layer and head; 95% intervals over prompts). Clean: sink at 0 "
             f"{_cell(first['sink_at_0_before'])}. Doses:", "",
             *[f"- {name}: {what}" for name, what in data.get("move_interventions", {}).items()],
             "", "| k | intervention | dose | sink at k (clean -> after) | sink at 0 after | "
             "max abs channel at k | moved |", "|---|---|---|---|---|---|---|"]
    for r in move:
        iv = r["intervals"]
        word = (chain.TOO_FEW if r["moved"] is None else "yes" if r["moved"] else
                "no (rose)" if r["rose"] else "no")
        lines.append(f"| {r['k']} | {r['intervention']} | {r['dose']:g} | "
                     f"{r['sink_at_k_before']:.3f} -> {_cell(iv['sink_at_k_after'])} | "
                     f"{_cell(iv['sink_at_0_after'])} | {r['channel_at_k_after']:.1f} | "
                     f"{word} |")
    curves = data.get("move_curves") or []
    if curves:
        lines += ["", "Saturation (the last dose step of each curve, paired over prompts):", "",
                  "| k | intervention | doses | sink at k along the doses | last step | "
                  "saturated |", "|---|---|---|---|---|---|"]
        lines += [f"| {c['k']} | {c['intervention']} | {', '.join(f'{d:g}' for d in c['doses'])}"
                  f" | {', '.join(f'{v:.3f}' for v in c['sink_at_k'])} | "
                  f"{_cell(c['last_step'])} | {_saturation(c)} |" for c in curves]
    return lines


def summary(data: dict[str, Any]) -> str:
    """The Markdown summary: the complete sets, the channel's life, the curves, the surgery,
    the key logits, the sink moved, the verdicts with their criteria."""
    sets = data["super_neuron_sets"]
    channel, layer = sets["channel"], sets["creating_layer"]
    lines = [f"# Structural origin of the sink on {data['model']}", "",
             f"Natural text, {data['n']} x {data['seq_len']} tokens, first token: "
             f"{data.get('traced_variant', 'bos')}. Intervals: 95% "
             "over prompts (Student's t below 64 prompts, percentile bootstrap from 64; "
             "differences paired over the same prompts). Massive channel at position 0: "
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
    lines += move_table(data)
    lines += ["", *verdict_lines(data["verdicts"])]
    lines += ["", f"![structural origin]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_structural_origin

    return plot_structural_origin(data, path)
