"""C8: does head-wise RMSNorm speed convergence and change the sink? (seeds/002)

Twin organisms: the same recipe, seed, data and steps, with and without head-wise RMSNorm
(mechsink.variants), over several seeds. We compare loss curves (mean and spread over seeds)
and the sink timeline of each twin, and state a verdict with the numbers.

    python circuits/headwise_rmsnorm.py --out runs/c8 [--recipe bb-gpt2-tiny] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from mechsink.io import atomic_write_text
from mechsink.timeline import sink_timeline
from mechsink.training import HWRMS_SUFFIX, get_recipe, train
from mechsink.viz.experiments import plot_twins

SCHEMA = "mechsink-c8/1"
HELD_OUT_SEED = 10_000  # data seed of the measurement batch: never seen in training


def run_arm(recipe_name: str, seed: int, steps: int, out: Path) -> dict:
    folder = out / "runs" / f"{recipe_name}-seed{seed}"
    if not (folder / "run.json").is_file() or json.loads(
            (folder / "run.json").read_text())["checkpoints"][-1] != steps:
        train(recipe_name, folder, steps=steps, seed=seed, resume=folder.exists())
    recipe = get_recipe(recipe_name)
    tokens = recipe.task().batch(HELD_OUT_SEED, 0, 32, recipe.seq_len)
    run = json.loads((folder / "run.json").read_text())
    timeline = [vars(p) for p in sink_timeline(folder, tokens)]
    return {"seed": seed, "losses": run["losses"], "train_seconds": run["seconds"],
            "timeline": timeline}


def final_loss(run: dict) -> float:
    """Mean training loss over the last 5% of steps."""
    tail = max(1, len(run["losses"]) // 20)
    return statistics.fmean(run["losses"][-tail:])


def mean_loss(run: dict) -> float:
    """Mean training loss over the whole run: lower means faster convergence."""
    return statistics.fmean(run["losses"])


def verdict(plain: list[float], hwrms: list[float]) -> str:
    """Paired over seeds: 'supported' when head-wise RMSNorm's loss is lower by more than two
    standard errors of the paired difference, 'not supported' otherwise (slower or no
    difference beyond the seed noise)."""
    diffs = [h - p for p, h in zip(plain, hwrms, strict=True)]
    mean = statistics.fmean(diffs)
    se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else 0.0
    if mean + 2 * se < 0:
        return "supported"
    return "not supported (slower)" if mean - 2 * se > 0 else "not supported (no difference)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipe", default="bb-gpt2-tiny")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    arms = {name: [run_arm(name, s, args.steps, args.out) for s in args.seeds]
            for name in (args.recipe, args.recipe + HWRMS_SUFFIX)}
    plain, hwrms = ([final_loss(r) for r in runs] for runs in arms.values())
    speed = [[mean_loss(r) for r in runs] for runs in arms.values()]
    last = {name: [r["timeline"][-1] for r in runs] for name, runs in arms.items()}
    result = {"schema": SCHEMA, "recipe": args.recipe, "seeds": args.seeds, "steps": args.steps,
              "eps": 0.3, "arms": arms, "final_loss": dict(zip(arms, (plain, hwrms), strict=True)),
              "mean_loss": dict(zip(arms, speed, strict=True)),
              "verdict_convergence": verdict(*speed), "verdict_final_loss": verdict(plain, hwrms)}
    atomic_write_text(args.out / "result.json", json.dumps(result, indent=1))
    plot_twins(result, args.out / "twins.png")

    lines = [f"# C8: head-wise RMSNorm, {args.recipe}, {args.steps} steps, seeds {args.seeds}", ""]
    lines += ["| arm | mean loss over the run, per seed | final loss (last 5%), per seed | "
              "sink rate at end (key 0, i > 0, eps 0.3) | largest sink score at end |",
              "|---|---|---|---|---|"]
    for k, name in enumerate(arms):
        rates = [p["sink_rate_no_self"] for p in last[name]]
        tops = [p["max_sink_score"] for p in last[name]]
        lines.append(f"| {name} | {', '.join(f'{x:.4f}' for x in speed[k])} | "
                     f"{', '.join(f'{x:.4f}' for x in (plain, hwrms)[k])} | "
                     f"{', '.join(f'{x:.3f}' for x in rates)} | "
                     f"{', '.join(f'{x:.3f}' for x in tops)} |")
    lines += ["", "Verdict on 'head-wise RMSNorm speeds convergence' (paired over seeds, lower by "
              f"more than 2 standard errors): by mean loss over the run "
              f"**{result['verdict_convergence']}**; by final loss "
              f"**{result['verdict_final_loss']}**.", "", "![twins](twins.png)", ""]
    atomic_write_text(args.out / "summary.md", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
