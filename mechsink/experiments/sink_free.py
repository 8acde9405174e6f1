"""Which attention variant removes the sink, which removes the massive activation, and at what cost
in loss? Twin organisms side by side.

For each task recipe (a llama recipe: Bigram-Backcopy, text) and each seed, plain softmax
attention and every variant of :data:`mechsink.model.variants.ATTENTION_VARIANTS` are trained with
the same seed (initialisation of the shared weights), the same batches and the same steps. Each
organism's checkpoints are measured on one held-out batch (data seed never seen in training):
final training loss (mean of the last 5% of steps), sink rate at key 0 (queries i > 0, eps as
given), the largest sink score, the largest residual magnitude, and the largest first-token norm
ratio; the table gives mean, standard deviation and range over seeds. The variants are: softmax1
(Miller 2023, "Attention Is Off By One"), a learnable sink logit (OpenAI 2025, gpt-oss model card),
gated attention (Qiu et al. 2025), softpick (Zuhri et al. 2025), sigmoid attention without
normalisation (Gu et al. 2024, "When Attention Sink Emerges in Language Models") and a learnable
key/value bias (Sun et al. 2024, "Massive Activations in Large Language Models").

Sink score of a variant with no normalisation over keys (sigmoid attention): the share of the
head's output mass on key 0, ``A[i,0] / sum_j A[i,j]``; for the others, the weight on key 0 as
it multiplies the value (it may sum to less than one over the keys: the rest went to the null
slot).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechsink.errors import BadInputError
from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult
from mechsink.io import atomic_write_json
from mechsink.measure.sinks import DEFAULT_EPS
from mechsink.measure.timeline import sink_timeline
from mechsink.model.variants import ATTENTION_VARIANTS
from mechsink.training.loop import get_recipe, train

FIGURE = "sink_free.png"
SCHEMA = "mechsink-sink-free/1"
HELD_OUT_SEED = 10_000  # data seed of the measurement batch: never seen in training
HELD_OUT_SEQUENCES = 32
PLAIN = "softmax"
METRICS = {  # key in a timeline point -> column title
    "final_loss": "final loss",
    "sink_rate_no_self": "sink rate",
    "max_sink_score": "largest sink score",
    "max_abs_resid": "largest |residual|",
    "first_token_norm_ratio": "first-token norm ratio",
}


def arm_name(recipe: str, variant: str) -> str:
    """The recipe name of one arm (``bb-llama-tiny`` or ``bb-llama-tiny+softpick``)."""
    return recipe if variant == PLAIN else f"{recipe}+{variant}"


def final_loss(losses: list[float]) -> float:
    """Mean training loss over the last 5% of steps."""
    tail = max(1, len(losses) // 20)
    return statistics.fmean(losses[-tail:])


def run_arm(recipe: str, variant: str, seed: int, steps: int, work_dir: Path,
            eps: float = DEFAULT_EPS) -> dict:
    """Train (or resume, or reuse) one organism and measure its timeline; cached in the run
    folder as ``measured.json``."""
    name = arm_name(recipe, variant)
    folder = work_dir / "runs" / f"{name}-seed{seed}"
    measured = folder / "measured.json"
    key = {"steps": steps, "eps": eps, "held_out_seed": HELD_OUT_SEED}
    if measured.is_file():
        cached = json.loads(measured.read_text())
        if cached.get("key") == key:
            return cached["arm"]
    run_file = folder / "run.json"
    if not run_file.is_file() or json.loads(run_file.read_text())["checkpoints"][-1] != steps:
        train(name, folder, steps=steps, seed=seed, resume=folder.exists(), progress=False)
    r = get_recipe(name)
    tokens = r.task().batch(HELD_OUT_SEED, 0, HELD_OUT_SEQUENCES, r.seq_len)
    run = json.loads(run_file.read_text())
    timeline = [vars(p) for p in sink_timeline(folder, tokens, eps=eps)]
    arm = {"variant": variant, "seed": seed, "losses": run["losses"],
           "train_seconds": run["seconds"], "timeline": timeline,
           "final": {"final_loss": final_loss(run["losses"]),
                     **{k: timeline[-1][k] for k in METRICS if k != "final_loss"}}}
    atomic_write_json(measured, {"key": key, "arm": arm})
    return arm


def spread(values: list[float]) -> dict[str, float]:
    """Mean, standard deviation (0 for one value), min and max over seeds."""
    return {"mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def run(*, work_dir: str | Path, recipes: Sequence[str] = ("bb-llama-tiny", "text-llama-tiny"),
        variants: Sequence[str] = ATTENTION_VARIANTS, seeds: Sequence[int] = (0, 1, 2),
        steps: Sequence[int] = (6000, 150), eps: float = DEFAULT_EPS) -> ExperimentResult:
    """Train plain attention and each variant for each seed under ``work_dir/runs`` (resumed
    when already there).

    ``recipes``: task recipes (llama recipes); ``variants``: attention variants beside plain
    softmax; ``seeds``: one twin set per seed; ``steps``: one length per recipe (or one for
    all); ``eps``: sink-rate threshold."""
    check_experiment_settings("sink_free", locals())  # before any work, as the CLI does
    steps = list(steps)
    if len(steps) == 1:
        steps = steps * len(recipes)
    if len(steps) != len(recipes):
        raise BadInputError(f"give one --steps value, or one per recipe ({len(recipes)}); "
                            f"got {len(steps)}.")
    for v in variants:
        if v not in ATTENTION_VARIANTS:
            raise BadInputError(f"unknown variant {v!r}: choose from "
                                f"{', '.join(ATTENTION_VARIANTS)}.")
    for recipe in recipes:
        get_recipe(recipe)  # a bad name fails before any training
    work = Path(work_dir)
    tasks = {}
    for recipe, n in zip(recipes, steps, strict=True):
        arms = {v: [run_arm(recipe, v, s, n, work, eps) for s in seeds]
                for v in (PLAIN, *variants)}
        table = {v: {m: spread([a["final"][m] for a in runs]) for m in METRICS}
                 for v, runs in arms.items()}
        tasks[recipe] = {"steps": n, "data": get_recipe(recipe).data, "arms": arms,
                         "table": table}
    return ExperimentResult("sink_free", {"schema": SCHEMA, "seeds": list(seeds), "eps": eps,
                                          "held_out_seed": HELD_OUT_SEED, "tasks": tasks})


def summary(result: dict[str, Any]) -> str:
    """The Markdown summary: one table per task, mean +- sd [min, max] over seeds."""
    lines = ["# Sink-free attention variants, twin organisms", "",
             f"Seeds {result['seeds']} (each seed: the same initialisation of the shared weights "
             "and the same batches in every arm). Measured at the last checkpoint on a held-out "
             f"batch (data seed {result['held_out_seed']}) of {HELD_OUT_SEQUENCES} sequences. "
             "Sink score: the "
             "attention on key 0 averaged over queries i > 0; sink rate: the share of (sequence, "
             f"layer, head) whose score is above {result['eps']}; largest sink score: the "
             "largest (layer, head) score averaged over sequences. For sigmoid attention (no "
             "normalisation over keys) the sink score is the head's share of output mass on "
             "key 0.", ""]
    for recipe, task in result["tasks"].items():
        lines += [f"## {recipe} ({task['data']}), {task['steps']} steps", "",
                  "| arm | " + " | ".join(METRICS.values()) + " |",
                  "|---" * (len(METRICS) + 1) + "|"]
        for variant, row in task["table"].items():
            cells = [f"{c['mean']:.3g} ± {c['sd']:.2g} [{c['min']:.3g}, {c['max']:.3g}]"
                     for c in row.values()]
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [f"![variants]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_sink_free

    return plot_sink_free(data, path, METRICS)
