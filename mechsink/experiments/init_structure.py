"""Claim C7 as its paper states it (Li, Tong, Wang et al. 2026, "SeedPrint"): structure at
random initialisation, its persistence, and its positional discrepancy's link to the sink.

(i) **Token preference and contraction at init**, on random-init twins of real models'
    architectures (transformers' own init, several seeds): the ratio of the most to the median
    mean next-token probability on random input, read out after every depth and at several init
    scales (every weight matrix times the scale); the contraction as the mean pairwise cosine of
    representations across sequences and within a sequence, per layer; the contraction
    direction's overlap across seeds and, for one seed, across input sets.
(ii) **SeedPrint** (persistence): organisms trained from shared and from different
    initialisations, the identity test calibrated on a null of independent initialisations
    trained on the same data (:func:`mechsink.experiments.seedprint.seedprint_calibration`).
(iii) **The positional discrepancy** at init (position 0 against later positions in the
    within-sequence contraction, per layer, on the twins) and its causal link to the sink:
    organisms trained from one initialisation with W_O's init scaled by 0 (the discrepancy
    removed), 1 (plain) and a larger factor (amplified), same seed and data otherwise
    (:func:`mechsink.training.loop.scale_attention_output_init` says why W_O), with the sink
    over training and intervals over seeds.

A real model cannot answer (ii) or (iii)'s causal part: its initialisation seed is unknown.
The organisms answer them.
"""

from __future__ import annotations

import gc
import itertools
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mechsink.errors import BadInputError
from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult, verdict_lines
from mechsink.interventions.stats import bootstrap_interval
from mechsink.measure.seedprint import (
    contraction_direction,
    contraction_stats,
    depth_preference,
    residual_stack,
    scaled_weights,
)
from mechsink.measure.seedprint import random_tokens as _random_tokens
from mechsink.measure.sinks import DEFAULT_EPS

FIGURE = "init_structure.png"
SCHEMA = "mechsink-c7/2"
TWINS = ("smollm2-135m", "gemma3-270m", "qwen2.5-0.5b")
PREFERENCE_MIN = 10.0  # "extreme": the top token at least an order of magnitude over the median
CONTRACTION_MIN = 0.1  # rise of the across-sequence cosine from the embeddings to the last layer
DISCREPANCY_MIN = 0.05  # later-later minus position-0-later cosine at the last layer
HELD_OUT_SEED = 10_000  # data seed of the organisms' measurement batch


# --- (i) and (iii) at init, on random twins ---------------------------------------------------


def twin_factory(model: Any) -> Callable[[int], Any]:
    """seed -> a random-init twin of ``model``'s architecture: its transformers config and
    tokenizer, freshly initialised from that seed by the family's own init. Holds the config,
    not the model, so the model can be freed first."""
    from mechsink.model import hf_model_of, wrap
    from mechsink.model.zoo.random_init import seeded_model

    config, tokenizer = hf_model_of(model).config, model.tokenizer
    return lambda seed: wrap(seeded_model(config, seed).eval(), tokenizer,
                             name="random-init twin")


def twin_builder(name: str) -> tuple[Callable[[int], Any], str]:
    """:func:`twin_factory` of zoo model ``name`` (loaded once for its config, then freed), and
    the architecture's name."""
    from mechsink.model import hf_model_of, load_model

    model = load_model(name, device="cpu")
    arch = str(getattr(hf_model_of(model).config, "model_type", "?"))
    build = twin_factory(model)
    del model
    gc.collect()
    return build, arch


def init_profile(model: Any, tokens: torch.Tensor, other_tokens: torch.Tensor | None,
                 scales: Sequence[float]) -> tuple[dict[str, Any], torch.Tensor]:
    """One random model's init-time measurements at each init scale: token preference after
    every depth and the contraction of every layer; at scale 1 also the contraction direction
    (returned) and its overlap with the direction on ``other_tokens``."""
    out: dict[str, Any] = {"n_layers": int(model.cfg.n_layers), "scales": {}}
    direction = None
    for scale in scales:
        with scaled_weights(model, scale):
            stack = residual_stack(model, tokens)
            out["scales"][f"{scale:g}"] = {
                "preference": [p.to_dict() for p in depth_preference(model, stack)],
                "contraction": [contraction_stats(s).to_dict() for s in stack]}
            if scale == 1:
                direction = contraction_direction(stack[-1].flatten(0, 1))
                if other_tokens is not None:
                    other = contraction_direction(residual_stack(model, other_tokens)[-1]
                                                  .flatten(0, 1))
                    out["overlap_other_inputs"] = abs(torch.dot(direction, other).item())
        del stack
    if direction is None:
        raise BadInputError("init scales must include 1 (the architecture's own init).")
    return out, direction


def twin_profiles(build: Callable[[int], Any], seeds: Sequence[int], n: int, seq_len: int,
                  scales: Sequence[float], token_seed: int = 1) -> dict[str, Any]:
    """:func:`init_profile` of the twin of each seed (one in memory at a time) on the same
    random sequences, and the contraction direction's overlap across seeds."""
    profiles, directions = {}, {}
    tokens = other = None
    for seed in seeds:
        model = build(seed)
        if tokens is None:
            tokens = _random_tokens(model, n, seq_len, seed=token_seed)
            other = _random_tokens(model, n, seq_len, seed=token_seed + 1)
        profiles[str(seed)], directions[seed] = init_profile(
            model, tokens, other if seed == seeds[0] else None, scales)
        del model
        gc.collect()
    overlaps = {f"{a}-{b}": abs(torch.dot(directions[a], directions[b]).item())
                for a, b in itertools.combinations(seeds, 2)}
    return {"seeds": list(seeds), "n": n, "seq_len": seq_len, "scales": [float(s) for s in scales],
            "profiles": profiles, "overlap_across_seeds": overlaps,
            "verdicts": init_verdicts(profiles, overlaps)}


def _at(profile: dict[str, Any], scale: str = "1") -> dict[str, Any]:
    return profile["scales"][scale]


def init_verdicts(profiles: dict[str, dict[str, Any]], overlaps: dict[str, float]
                  ) -> dict[str, dict[str, str]]:
    """Verdicts on (i) and (iii)-at-init from twin profiles (each criterion written beside it)."""
    ratios = [_at(p)["preference"][-1]["ratio"] for p in profiles.values()]
    rise = [_at(p)["contraction"][-1]["across"] - _at(p)["contraction"][0]["across"]
            for p in profiles.values()]
    within_over = [_at(p)["contraction"][-1]["within"] - _at(p)["contraction"][-1]["across"]
                   for p in profiles.values()]
    disc = [_at(p)["contraction"][-1]["discrepancy"] for p in profiles.values()]
    first = next(iter(profiles.values()))
    same = first.get("overlap_other_inputs")
    seed_dependent = bool(overlaps) and same is not None and max(overlaps.values()) < same
    contraction_ok = min(rise) >= CONTRACTION_MIN and min(within_over) > 0
    every_seed = f"in every seed ({len(profiles)})"
    fmt = lambda xs: ", ".join(f"{x:.3g}" for x in xs)  # noqa: E731
    return {
        "(i) token preference at init": {
            "verdict": "supported" if min(ratios) >= PREFERENCE_MIN else "not supported",
            "criterion": f"supported if the ratio of the most to the median mean next-token "
                         f"probability on random input, full depth, the architecture's own init "
                         f"scale, is at least {PREFERENCE_MIN:g} {every_seed}",
            "evidence": f"max/median per seed: {fmt(ratios)}"},
        "(i) contraction at init": {
            "verdict": ("supported" if contraction_ok and seed_dependent else "partial"
                        if contraction_ok or seed_dependent else "not supported"),
            "criterion": f"supported if, {every_seed}, the mean cosine across sequences rises "
                         f"by at least {CONTRACTION_MIN:g} from the embeddings to the last "
                         "layer and the within-sequence cosine exceeds it there, and the "
                         "contraction direction is seed-dependent (|cos| between seeds' "
                         "directions below |cos| of one seed's directions on two input sets); "
                         "partial if one of the two holds",
            "evidence": f"across-sequence rise {fmt(rise)}; within minus across at the last "
                        f"layer {fmt(within_over)}; direction |cos| across seeds "
                        f"{fmt(overlaps.values())}, same seed other inputs "
                        f"{'n/a' if same is None else f'{same:.3g}'}"},
        "(iii) positional discrepancy at init": {
            "verdict": "supported" if min(disc) >= DISCREPANCY_MIN else "not supported",
            "criterion": f"supported if at the last layer later positions are more alike each "
                         f"other than position 0 is to them (later-later minus position-0-later "
                         f"mean cosine) by at least {DISCREPANCY_MIN:g} {every_seed}",
            "evidence": f"discrepancy per seed: {fmt(disc)}"},
    }


def twin_row(work: Path, name: str, seeds: list[int], n: int, seq_len: int,
             scales: list[float]) -> dict[str, Any]:
    """:func:`twin_profiles` of ``name``'s twins, cached under ``work/twins`` with the settings
    it ran under (a rerun with the same settings reads it back, no model load)."""
    import hashlib
    import json

    from mechsink.io import atomic_write_json

    key = {"model": name, "seeds": seeds, "n": n, "seq_len": seq_len,
           "scales": [float(x) for x in scales], "schema": SCHEMA}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    cached = work / "twins" / f"{digest}.json"
    if cached.is_file():
        saved = json.loads(cached.read_text(encoding="utf-8"))
        if saved.get("key") == key:
            return saved["row"]
    build, arch = twin_builder(name)
    row = {"architecture": arch, **twin_profiles(build, seeds, n, seq_len, scales)}
    cached.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(cached, {"key": key, "row": row})
    return row


# --- (iii) causal part and (ii), on organisms -------------------------------------------------


def _interval(values: Sequence[float]) -> dict[str, Any]:
    return bootstrap_interval(list(values)).to_dict()


def step0_discrepancy(folder: Path, n: int = 32) -> dict[str, float]:
    """The last layer's contraction of a run's step-0 organism on random input."""
    from mechsink.model import load_model

    model = load_model(f"organism:{folder / 'step-0'}", device="cpu")
    seq_len = int(model.cfg.n_ctx) if int(model.cfg.n_ctx) <= 64 else 64
    stack = residual_stack(model, _random_tokens(model, n, seq_len, seed=1))
    return contraction_stats(stack[-1]).to_dict()


def init_arms(work_dir: Path, recipe: str, wo_scales: Sequence[float], seeds: Sequence[int],
              steps: int, eps: float) -> dict[str, Any]:
    """Organisms of ``recipe`` with W_O's init scaled by each of ``wo_scales`` (same seed and
    data per seed across arms): their sink timelines, step-0 discrepancy, intervals over seeds."""
    from mechsink.experiments.sink_free import PLAIN, run_arm
    from mechsink.training.loop import get_recipe, wo_suffix

    arms: dict[str, Any] = {}
    for scale in wo_scales:
        name = recipe + wo_suffix(scale)
        get_recipe(name)  # a bad name fails before any training
        variant = wo_suffix(scale).lstrip("+") or PLAIN
        runs = [run_arm(recipe, variant, s, steps, work_dir, eps) for s in seeds]
        disc = [step0_discrepancy(work_dir / "runs" / f"{name}-seed{s}") for s in seeds]
        timeline_steps = [p["step"] for p in runs[0]["timeline"]]
        arms[f"{scale:g}"] = {
            "recipe": name, "wo_scale": float(scale),
            "step0": [d["discrepancy"] for d in disc],
            "step0_within": [d["within"] for d in disc],
            "final_max_sink_score": [r["final"]["max_sink_score"] for r in runs],
            "final_sink_rate": [r["final"]["sink_rate_no_self"] for r in runs],
            "final_loss": [r["final"]["final_loss"] for r in runs],
            "over_training": [{
                "step": step,
                "max_sink_score": _interval([r["timeline"][i]["max_sink_score"] for r in runs]),
                "sink_rate": _interval([r["timeline"][i]["sink_rate_no_self"] for r in runs])}
                for i, step in enumerate(timeline_steps)]}
    return arms


def causal_verdict(arms: dict[str, Any], plain: str = "1") -> dict[str, str]:
    """(iii)'s causal part: paired over seeds against the plain arm, the final largest sink
    score moves down where the step-0 discrepancy was removed and up where it was amplified."""
    if plain not in arms:
        raise BadInputError("the W_O scales must include 1 (the plain arm).")
    base, base_disc = arms[plain]["final_max_sink_score"], statistics.fmean(arms[plain]["step0"])
    tests, notes = [], []
    for key, arm in arms.items():
        if key == plain:
            continue
        moved = statistics.fmean(arm["step0"]) - base_disc
        diff = _interval([a - b for a, b in zip(arm["final_max_sink_score"], base, strict=True)])
        notes.append(f"W_O x{key}: step-0 discrepancy {statistics.fmean(arm['step0']):.3g} "
                     f"(plain {base_disc:.3g}), final largest sink score minus plain "
                     f"{diff['mean']:.3g} [{diff['low']:.3g}, {diff['high']:.3g}]")
        if abs(moved) < DISCREPANCY_MIN:
            notes[-1] += " (discrepancy not moved at step 0: not judged)"
            continue
        sign = 1 if moved > 0 else -1
        tests.append("with" if min(sign * diff["low"], sign * diff["high"]) > 0 else
                     "against" if max(sign * diff["low"], sign * diff["high"]) < 0 else "none")
    verdict = ("not supported" if "against" in tests else "undecided" if "with" not in tests
               else "supported" if all(t == "with" for t in tests) else "partial")
    return {"verdict": verdict,
            "criterion": "supported if every arm whose step-0 discrepancy moved by at least "
                         f"{DISCREPANCY_MIN:g} from the plain arm's moves the final largest sink "
                         "score the same way, the 95% interval of the paired difference over "
                         "seeds excluding 0; partial if some do and none moves it the other "
                         "way; not supported if one moves it the other way (interval excluding "
                         "0); undecided if no interval excludes 0 or no arm moved the discrepancy",
            "evidence": "; ".join(notes)}


def seedprint_verdict(cal: dict[str, Any]) -> dict[str, str]:
    """(ii): the calibrated SeedPrint rule (on the test's ``z``, the paper's statistic) on
    held-out organisms; the rule calibrated on the mean tau is reported beside it."""
    fp, fn = cal["calibrated"]["false_positive"], cal["calibrated"]["false_negative"]
    tau_fp = cal["calibrated_tau"]["false_positive"]
    tau_fn = cal["calibrated_tau"]["false_negative"]
    ok = fp["errors"] == 0 and fn["errors"] == 0
    some = fp["rate"] < 0.5 and fn["rate"] < 0.5
    return {"verdict": "supported" if ok else "partial" if some else "not supported",
            "criterion": "supported if SeedPrint's calibrated threshold calls every held-out "
                         "pair sharing an initialisation 'same' and no other pair (trained "
                         "organisms, different data orders); partial if both error rates are "
                         "below 0.5",
            "evidence": f"false positives {fp['errors']}/{fp['n']} (95% CI [{fp['low']:.2f}, "
                        f"{fp['high']:.2f}]), false negatives {fn['errors']}/{fn['n']} "
                        f"([{fn['low']:.2f}, {fn['high']:.2f}]) after {cal['steps']} steps; "
                        "calibrated on the mean tau instead: false positives "
                        f"{tau_fp['errors']}/{tau_fp['n']}, false negatives "
                        f"{tau_fn['errors']}/{tau_fn['n']}"}


def run(*, work_dir: str | Path, twins: Sequence[str] = TWINS, twin_seeds: Sequence[int] = (0, 1),
        n: int = 32, seq_len: int = 64, scales: Sequence[float] = (0.5, 1.0, 2.0),
        recipe: str = "bb-gpt2-tiny", wo_scales: Sequence[float] = (0.0, 1.0, 16.0),
        seeds: Sequence[int] = (0, 1, 2), steps: int = 500, seedprint_steps: int = 150,
        null_inits: int = 3, held_out_inits: int = 2, k: int = 16,
        eps: float = DEFAULT_EPS) -> ExperimentResult:
    """(i) and (iii) at init on random twins of each of ``twins`` (cached under
    ``work_dir/twins``); (ii) and (iii)'s causal part on organisms trained under
    ``work_dir/runs`` (resumed or reused when already there).

    ``twins``: models whose architecture is re-initialised (zoo names); ``twin_seeds``: init
    seeds of each twin; ``n``: random sequences; ``seq_len``: tokens per sequence; ``scales``:
    init scales (every weight matrix times the scale; 1 is the architecture's own);
    ``recipe``: the organisms' recipe; ``wo_scales``: W_O init scales of the causal arms (0
    removes the discrepancy, 1 is plain); ``seeds``: organism seeds per arm; ``steps``:
    training steps of the arms; ``seedprint_steps``: training steps of the SeedPrint
    organisms; ``null_inits``: independent inits of SeedPrint's null; ``held_out_inits``:
    inits trained on two data orders each (SeedPrint's test pairs); ``k``: vocabulary entries
    SeedPrint compares; ``eps``: sink-rate threshold."""
    check_experiment_settings("init_structure", locals())  # before any work, as the CLI does
    if seq_len < 3 or n < 2 or len(twin_seeds) < 2 or len(seeds) < 2:
        raise BadInputError("need n >= 2 sequences of >= 3 tokens, >= 2 twin seeds (the "
                            "direction across seeds) and >= 2 organism seeds (intervals).")
    if 1.0 not in [float(s) for s in scales] or 1.0 not in [float(s) for s in wo_scales]:
        raise BadInputError("scales and wo_scales must include 1 (the plain init).")
    work = Path(work_dir)
    twin_rows = {name: twin_row(work, name, list(twin_seeds), n, seq_len, list(scales))
                 for name in twins}
    arms = init_arms(work, recipe, wo_scales, seeds, steps, eps)
    from mechsink.experiments.seedprint import seedprint_calibration

    cal = seedprint_calibration(work, recipe, seedprint_steps, null_inits, held_out_inits, k)
    organisms = {"recipe": recipe, "seeds": list(seeds), "steps": steps, "eps": eps,
                 "arms": arms, "seedprint": cal,
                 "verdicts": {"(ii) SeedPrint across seeds": seedprint_verdict(cal),
                              "(iii) discrepancy causes the sink": causal_verdict(arms)}}
    return ExperimentResult("init_structure", {"schema": SCHEMA, "twins": twin_rows,
                                               "organisms": organisms})


def summary(data: dict[str, Any]) -> str:
    """The Markdown summary: per twin the preference by depth and scale, the contraction by
    layer, the verdicts; the organisms' arms and SeedPrint."""
    lines = ["# C7: structure at random initialisation (Li, Tong, Wang et al. 2026)", ""]
    for name, twin in data["twins"].items():
        lines += [f"## Random-init twins of {name} ({twin['architecture']}), seeds "
                  f"{twin['seeds']}", "",
                  f"Random input: {twin['n']} sequences of {twin['seq_len']} ordinary tokens.",
                  "", "Token preference (max / median mean next-token probability) after each "
                  "depth, first seed:", "",
                  "| init scale | " + " | ".join(
                      str(d + 1) for d in range(next(iter(twin["profiles"].values()))
                                                ["n_layers"])) + " |",
                  "|---|" + "---|" * next(iter(twin["profiles"].values()))["n_layers"]]
        first = next(iter(twin["profiles"].values()))
        for scale, at in first["scales"].items():
            lines.append(f"| x{scale} | " + " | ".join(f"{p['ratio']:.3g}"
                                                      for p in at["preference"]) + " |")
        lines += ["", "Contraction per layer (first seed, own init scale; layer 0 = embeddings):",
                  "", "| layer | across sequences | within a sequence | position 0 to later | "
                  "later to later | discrepancy |", "|---|---|---|---|---|---|"]
        for i, c in enumerate(first["scales"]["1"]["contraction"]):
            lines.append(f"| {i} | {c['across']:.3f} | {c['within']:.3f} | "
                         f"{c['first_to_later']:.3f} | {c['later_to_later']:.3f} | "
                         f"{c['discrepancy']:.3f} |")
        lines += ["", *verdict_lines(twin["verdicts"]), ""]
    org = data["organisms"]
    lines += [f"## Organisms: {org['recipe']}, {org['steps']} steps, seeds {org['seeds']}", "",
              "W_O's init scaled per arm (same seed and data otherwise). Step-0 discrepancy: "
              "last layer, random input; largest sink score and sink rate (key 0, queries "
              f"i > 0, eps {org['eps']}) on a held-out batch at the last step, per seed.", "",
              "| W_O init scale | step-0 discrepancy | final largest sink score | final sink "
              "rate | final loss |", "|---|---|---|---|---|"]
    fmt = lambda xs: ", ".join(f"{x:.3g}" for x in xs)  # noqa: E731
    for key, arm in org["arms"].items():
        lines.append(f"| x{key} | {fmt(arm['step0'])} | {fmt(arm['final_max_sink_score'])} | "
                     f"{fmt(arm['final_sink_rate'])} | {fmt(arm['final_loss'])} |")
    from mechsink.experiments.seedprint import calibration_lines

    lines += ["", *calibration_lines(org["seedprint"]), *verdict_lines(org["verdicts"]), "",
              f"![C7]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_init_structure

    return plot_init_structure(data, path)
