"""Structure at random initialisation, and SeedPrint (Li, Tong, Wang et al. 2026).

1. Token preference at init (max / median of the mean next-token probability on random input)
   across families, depths and init schemes.
2. The contraction direction (top principal direction of final states on random input): how
   much of the states it holds, and its overlap across seeds and across input sets.
3. SeedPrint between organisms trained from the same and from different initialisations (same
   recipe; twins differ in data order), with false-positive and false-negative rates.
4. SeedPrint calibrated: the null distribution of ``z`` from pairs of independent
   initialisations trained on the same data, a threshold calibrated from it, and false-positive
   and false-negative rates with exact 95% intervals on held-out organisms (other inits, other
   data), next to the rates of the paper's ``p < 0.01`` rule on the same pairs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mechsink.errors import BadInputError
from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult
from mechsink.measure.seedprint import (
    INIT_SCHEMES,
    calibrate_threshold,
    contraction_direction,
    error_rate,
    explained_fraction,
    final_states,
    init_model,
    last_logits,
    random_tokens,
    seedprint_test,
    token_preference,
)
from mechsink.model import load_model
from mechsink.training.loop import Recipe, train

SCHEMA = "mechsink-c7/1"


def preference_grid(size: str, depths: list[int], n: int, seq_len: int) -> list[dict]:
    rows = []
    for family, depth, scheme in itertools.product(("gpt2", "llama"), depths, INIT_SCHEMES):
        model = init_model(f"{family}-{size}", seed=0, scheme=scheme, n_layers=depth)
        pref = token_preference(last_logits(model, random_tokens(model, n, seq_len, seed=1)))
        rows.append({"family": family, "n_layers": depth, "scheme": scheme, **pref.to_dict()})
    return rows


def contraction(size: str, n: int, seq_len: int, seeds: list[int]) -> list[dict]:
    rows = []
    for family in ("gpt2", "llama"):
        models = {s: init_model(f"{family}-{size}", seed=s) for s in seeds}
        dirs, fractions = {}, {}
        for s, model in models.items():
            states = final_states(model, random_tokens(model, n, seq_len, seed=100))
            dirs[s] = contraction_direction(states)
            fractions[s] = explained_fraction(states, dirs[s])
        other_inputs = contraction_direction(
            final_states(models[seeds[0]], random_tokens(models[seeds[0]], n, seq_len, seed=200)))
        rows.append({
            "family": family,
            "explained_fraction": fractions,
            "overlap_across_seeds": {f"{a}-{b}": abs(torch.dot(dirs[a], dirs[b]).item())
                                     for a, b in itertools.combinations(seeds, 2)},
            "overlap_same_seed_other_inputs": abs(torch.dot(dirs[seeds[0]], other_inputs).item()),
        })
    return rows


def seedprint_pairs(work_dir: Path, recipe: str, steps: int, inits: list[int], k: int) -> dict:
    models = {}
    for init, data in itertools.product(inits, (0, 1)):
        run = work_dir / "runs" / f"{recipe}-init{init}-data{data}"
        if not (run / f"step-{steps}").is_dir():
            train(recipe, run, steps=steps, seed=init, data_seed=data, resume=run.exists())
        models[init, data] = load_model(f"organism:{run / f'step-{steps}'}", device="cpu")
    tokens = random_tokens(next(iter(models.values())), 128, 32, seed=7)
    logits = {key: last_logits(m, tokens) for key, m in models.items()}
    pairs = []
    for a, b in itertools.combinations(models, 2):
        r = seedprint_test(logits[a], logits[b], k=k)
        pairs.append({"a": list(a), "b": list(b), "same_init": a[0] == b[0], **r.to_dict(),
                      "called_same": r.same_seed()})
    same = [p for p in pairs if p["same_init"]]
    diff = [p for p in pairs if not p["same_init"]]
    return {"recipe": recipe, "steps": steps, "k": k, "pairs": pairs,
            "false_negative_rate": sum(not p["called_same"] for p in same) / len(same),
            "false_positive_rate": sum(p["called_same"] for p in diff) / len(diff),
            "min_z_same": min(p["z"] for p in same), "max_z_different": max(p["z"] for p in diff)}


def _trained_logits(work_dir: Path, recipe: str | Recipe, steps: int,
                    organisms: list[tuple[int, int]], tokens: torch.Tensor | None
                    ) -> tuple[dict[tuple[int, int], torch.Tensor], torch.Tensor]:
    """Last-position logits of organisms (init seed, data seed) after ``steps`` steps, on the
    same random tokens (drawn from the first organism's vocabulary when not given)."""
    name = recipe if isinstance(recipe, str) else recipe.name
    logits = {}
    for init, data in organisms:
        run = work_dir / "runs" / f"{name}-init{init}-data{data}"
        if not (run / f"step-{steps}").is_dir():
            train(recipe, run, steps=steps, seed=init, data_seed=data, resume=run.exists(),
                  progress=False)
        model = load_model(f"organism:{run / f'step-{steps}'}", device="cpu")
        if tokens is None:
            tokens = random_tokens(model, 128, 32, seed=7)
        logits[init, data] = last_logits(model, tokens)
    assert tokens is not None
    return logits, tokens


def seedprint_calibration(work_dir: str | Path, recipe: str | Recipe = "bb-llama-tiny",
                          steps: int = 200, null_inits: int = 6, held_out_inits: int = 4,
                          k: int = 32, alpha: float = 0.01) -> dict:
    """Null: ``null_inits`` organisms (init seeds 100, 101, ...) trained on data seed 0, every
    pair of them. Held out: ``held_out_inits`` other inits (200, 201, ...) each trained on data
    seeds 1 and 2; pairs sharing an init are positives, the rest negatives. Two statistics are
    calibrated on the same null: the test's ``z`` and the mean Kendall tau alone (``z`` divides
    it by the taus' spread, which is noisy over ``k`` dimensions)."""
    if null_inits < 3 or held_out_inits < 2:
        raise BadInputError("need >= 3 null inits (3 pairs) and >= 2 held-out inits.")
    work = Path(work_dir)
    null_orgs = [(100 + i, 0) for i in range(null_inits)]
    held = [(200 + i, d) for i in range(held_out_inits) for d in (1, 2)]
    null_logits, tokens = _trained_logits(work, recipe, steps, null_orgs, None)
    held_logits, _ = _trained_logits(work, recipe, steps, held, tokens)
    null = [seedprint_test(null_logits[a], null_logits[b], k=k)
            for a, b in itertools.combinations(null_orgs, 2)]
    cal = calibrate_threshold([r.z for r in null], alpha)
    cal_tau = calibrate_threshold([r.mean_tau for r in null], alpha)
    pairs = []
    for a, b in itertools.combinations(held, 2):
        r = seedprint_test(held_logits[a], held_logits[b], k=k)
        pairs.append({"a": list(a), "b": list(b), "same_init": a[0] == b[0], **r.to_dict(),
                      "paper_rule": r.same_seed(), "calibrated": cal.same_seed(r),
                      "calibrated_tau": r.mean_tau > cal_tau.threshold})
    pos = [p for p in pairs if p["same_init"]]
    neg = [p for p in pairs if not p["same_init"]]

    def rates(rule: str) -> dict:
        return {"false_positive": error_rate(sum(p[rule] for p in neg), len(neg)),
                "false_negative": error_rate(sum(not p[rule] for p in pos), len(pos))}

    return {"recipe": recipe if isinstance(recipe, str) else recipe.name, "steps": steps,
            "k": k, "alpha": alpha, "null_z": [r.z for r in null],
            "null_mean_tau": [r.mean_tau for r in null],
            "null_paper_rule_positive": sum(r.same_seed() for r in null),
            "calibration": cal.to_dict(), "calibration_tau": cal_tau.to_dict(), "pairs": pairs,
            "paper_rule": rates("paper_rule"), "calibrated": rates("calibrated"),
            "calibrated_tau": rates("calibrated_tau")}


def calibration_lines(cal: dict) -> list[str]:
    """Markdown lines for :func:`seedprint_calibration`'s result."""
    c, t = cal["calibration"], cal["calibration_tau"]

    def fmt(r: dict) -> str:
        return f"{r['rate']:.2f} [{r['low']:.2f}, {r['high']:.2f}] ({r['errors']}/{r['n']})"

    return [f"SeedPrint calibrated on {cal['recipe']} organisms after {cal['steps']} steps "
            f"(k = {cal['k']}): null = {c['n_null']} pairs of independent inits trained on the "
            f"same data, z mean {c['null_mean']:.1f}, sd {c['null_sd']:.1f}, max "
            f"{c['null_max']:.1f}; the paper's rule called {cal['null_paper_rule_positive']} of "
            f"them 'same seed'. Calibrated threshold (normal fit, alpha {cal['alpha']}, never "
            f"below the null maximum): z > {c['threshold']:.1f}.", "",
            "| rule | false-positive rate [95% CI] | false-negative rate [95% CI] |",
            "|---|---|---|",
            f"| paper: p < 0.01 and z > 0 | {fmt(cal['paper_rule']['false_positive'])} | "
            f"{fmt(cal['paper_rule']['false_negative'])} |",
            f"| calibrated: z > {c['threshold']:.1f} | "
            f"{fmt(cal['calibrated']['false_positive'])} | "
            f"{fmt(cal['calibrated']['false_negative'])} |",
            f"| calibrated on mean tau: tau > {t['threshold']:.3f} (null mean "
            f"{t['null_mean']:.3f}, max {t['null_max']:.3f}) | "
            f"{fmt(cal['calibrated_tau']['false_positive'])} | "
            f"{fmt(cal['calibrated_tau']['false_negative'])} |", ""]


def run(*, work_dir: str | Path, recipe: str = "bb-llama-tiny", steps: int = 200,
        size: str = "mini", depths: Sequence[int] = (2, 4, 8), n: int = 64,
        k: int = 32, null_inits: int = 6, held_out_inits: int = 4,
        alpha: float = 0.01) -> ExperimentResult:
    """Parts 1 and 2 on ``random:*-{size}`` models; part 3 trains 6 organisms under
    ``work_dir/runs`` (inits 0, 1, 2 x data orders 0, 1; resumed when already there); part 4
    trains ``null_inits + 2 * held_out_inits`` more (:func:`seedprint_calibration`).

    ``recipe``: the organisms' recipe; ``steps``: their training steps; ``size``: random-model
    size for parts 1 and 2; ``depths``: layer counts of part 1's models; ``n``: random
    sequences; ``k``: vocabulary entries SeedPrint compares; ``null_inits``: independent
    initialisations trained on one data order (the null); ``held_out_inits``: initialisations
    each trained on two data orders (the test pairs); ``alpha``: false-positive rate the
    calibrated threshold aims for."""
    check_experiment_settings("seedprint", locals())  # before any work, as the CLI does
    result = {"schema": SCHEMA, "n": n, "seq_len": 32, "size": size,
              "token_preference": preference_grid(size, list(depths), n, 32),
              "contraction": contraction(size, n, 32, seeds=[0, 1, 2]),
              "seedprint": seedprint_pairs(Path(work_dir), recipe, steps, [0, 1, 2], k),
              "calibrated": seedprint_calibration(work_dir, recipe, steps, null_inits,
                                                  held_out_inits, k, alpha)}
    return ExperimentResult("seedprint", result)


def summary(result: dict[str, Any]) -> str:
    """The Markdown summary: token preference, contraction, SeedPrint error rates."""
    lines = ["# Structure at initialisation and SeedPrint", "",
             f"Random input: {result['n']} sequences of {result['seq_len']} ordinary tokens; "
             f"`random:*-{result['size']}` "
             "configs with the depth overridden.", "",
             "| family | layers | init | max p | median p | max/median | top token |",
             "|---|---|---|---|---|---|---|"]
    for r in result["token_preference"]:
        lines.append(f"| {r['family']} | {r['n_layers']} | {r['scheme']} | {r['max_prob']:.2e} |"
                     f" {r['median_prob']:.2e} | {r['ratio']:.1f} | {r['top_token']} |")
    lines += ["", "| family | share of ||states||^2 on the direction (per seed) | |cos| across "
              "seeds | |cos| same seed, other inputs |", "|---|---|---|---|"]
    for r in result["contraction"]:
        lines.append(f"| {r['family']} | "
                     f"{', '.join(f'{v:.3f}' for v in r['explained_fraction'].values())} | "
                     f"{', '.join(f'{v:.3f}' for v in r['overlap_across_seeds'].values())} | "
                     f"{r['overlap_same_seed_other_inputs']:.3f} |")
    sp = result["seedprint"]
    lines += ["", f"SeedPrint on {sp['recipe']} organisms after {sp['steps']} steps "
              f"(inits 0, 1, 2 x data orders 0, 1; k = {sp['k']}; rule: p < 0.01 and z > 0): "
              f"false-positive rate {sp['false_positive_rate']:.2f}, false-negative rate "
              f"{sp['false_negative_rate']:.2f}; smallest z between shared inits "
              f"{sp['min_z_same']:.1f}, largest z between different inits "
              f"{sp['max_z_different']:.1f}.", ""]
    if "calibrated" in result:
        lines += calibration_lines(result["calibrated"])
    return "\n".join(lines)
