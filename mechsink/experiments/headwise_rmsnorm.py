"""Does head-wise RMSNorm speed convergence and change the sink? (Li, Jiang, Sun et al. 2026,
"The Structural Origin of Attention Sink", propose it.)

Twin organisms: the same recipe, seed, data and steps, with and without head-wise RMSNorm
(mechsink.model.variants), over several seeds. We compare loss curves (mean and spread over seeds)
and the sink timeline of each twin, and state a verdict with the numbers.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult
from mechsink.measure.sinks import DEFAULT_EPS
from mechsink.measure.timeline import sink_timeline
from mechsink.training.loop import HWRMS_SUFFIX, get_recipe, train

FIGURE = "twins.png"
SCHEMA = "mechsink-c8/1"
HELD_OUT_SEED = 10_000  # data seed of the measurement batch: never seen in training


def run_arm(recipe_name: str, seed: int, steps: int, work_dir: Path) -> dict:
    """Train (or resume) one arm's organism under ``work_dir/runs`` and read its timeline."""
    folder = work_dir / "runs" / f"{recipe_name}-seed{seed}"
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


def run(*, work_dir: str | Path, recipe: str = "bb-gpt2-tiny", seeds: Sequence[int] = (0, 1, 2),
        steps: int = 2000) -> ExperimentResult:
    """Train both arms for each seed under ``work_dir/runs`` (resumed when already there).

    ``recipe``: the organism recipe (its twin adds head-wise RMSNorm); ``seeds``: one twin
    pair per seed; ``steps``: training steps of every organism."""
    check_experiment_settings("headwise_rmsnorm", locals())  # before any work, as the CLI does
    arms = {name: [run_arm(name, s, steps, Path(work_dir)) for s in seeds]
            for name in (recipe, recipe + HWRMS_SUFFIX)}
    plain, hwrms = ([final_loss(r) for r in runs] for runs in arms.values())
    speed = [[mean_loss(r) for r in runs] for runs in arms.values()]
    result = {"schema": SCHEMA, "recipe": recipe, "seeds": list(seeds), "steps": steps,
              "eps": DEFAULT_EPS, "arms": arms,
              "final_loss": dict(zip(arms, (plain, hwrms), strict=True)),
              "mean_loss": dict(zip(arms, speed, strict=True)),
              "verdict_convergence": verdict(*speed), "verdict_final_loss": verdict(plain, hwrms)}
    return ExperimentResult("headwise_rmsnorm", result)


def summary(result: dict[str, Any]) -> str:
    """The Markdown summary: losses and end-of-run sinks per arm and seed, the verdicts."""
    arms = result["arms"]
    plain, hwrms = result["final_loss"].values()
    speed = list(result["mean_loss"].values())
    last = {name: [r["timeline"][-1] for r in runs] for name, runs in arms.items()}
    lines = [f"# Head-wise RMSNorm, {result['recipe']}, {result['steps']} steps, "
             f"seeds {result['seeds']}", ""]
    lines += ["| arm | mean loss over the run, per seed | final loss (last 5%), per seed | "
              f"sink rate at end (key 0, i > 0, eps {result['eps']}) | largest sink score at end |",
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
              f"**{result['verdict_final_loss']}**.", "", f"![twins]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_twins

    return plot_twins(data, path)
