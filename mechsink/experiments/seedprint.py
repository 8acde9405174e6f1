"""Structure at random initialisation, and SeedPrint (Li, Tong, Wang et al. 2026).

1. Token preference at init (max / median of the mean next-token probability on random input)
   across families, depths and init schemes.
2. The contraction direction (top principal direction of final states on random input): how
   much of the states it holds, and its overlap across seeds and across input sets.
3. SeedPrint between organisms trained from the same and from different initialisations (same
   recipe; twins differ in data order), with false-positive and false-negative rates.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mechsink.experiments.result import ExperimentResult
from mechsink.seedprint import (
    INIT_SCHEMES,
    contraction_direction,
    explained_fraction,
    final_states,
    init_model,
    last_logits,
    random_tokens,
    seedprint_test,
    token_preference,
)
from mechsink.training import train
from mechsink.zoo import load_model

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


def run(*, work_dir: str | Path, recipe: str = "bb-llama-tiny", steps: int = 200,
        size: str = "mini", depths: Sequence[int] = (2, 4, 8), n: int = 64,
        k: int = 32) -> ExperimentResult:
    """Parts 1 and 2 on ``random:*-{size}`` models; part 3 trains 6 organisms under
    ``work_dir/runs`` (inits 0, 1, 2 x data orders 0, 1; resumed when already there)."""
    result = {"schema": SCHEMA, "n": n, "seq_len": 32, "size": size,
              "token_preference": preference_grid(size, list(depths), n, 32),
              "contraction": contraction(size, n, 32, seeds=[0, 1, 2]),
              "seedprint": seedprint_pairs(Path(work_dir), recipe, steps, [0, 1, 2], k)}
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
    return "\n".join(lines)
