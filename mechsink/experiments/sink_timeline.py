"""The sink measurements at every checkpoint of an organism's training run (when, during
training, does the sink form?).

Every checkpoint reads the same held-out sequences (the run's task for Bigram-Backcopy runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult
from mechsink.measure.sinks import DEFAULT_EPS
from mechsink.measure.timeline import sink_timeline, timeline_dict
from mechsink.training.loop import get_recipe

FIGURE = "timeline.png"
RESULT_FILE = "timeline.json"


def held_out_tokens(run_dir: Path, n: int) -> torch.Tensor:
    """``n`` task sequences from a data seed the run never trained on."""
    run = json.loads((run_dir / "run.json").read_text())
    recipe = get_recipe(run["recipe"]["name"])
    return recipe.task().batch(10_000, 0, n, recipe.seq_len)


def run(*, run_dir: str | Path, n: int = 32, eps: float = DEFAULT_EPS) -> ExperimentResult:
    """Measure every checkpoint of the run in ``run_dir`` (written by ``mechsink train``).

    ``run_dir``: folder written by mechsink train; ``n``: held-out task sequences;
    ``eps``: sink-rate threshold."""
    check_experiment_settings("sink_timeline", locals())  # before any work, as the CLI does
    run_dir = Path(run_dir)
    points = sink_timeline(run_dir, held_out_tokens(run_dir, n), eps=eps)
    return ExperimentResult("sink_timeline", timeline_dict(points, run=str(run_dir), eps=eps))


def summary(data: dict[str, Any]) -> str:
    """A table: step, loss, sink rate, largest sink score, norm ratio, largest activation."""
    lines = [f"# Sink timeline of {data['run']}", "",
             "| step | loss | sink rate | largest sink score | norm ratio | max abs resid |",
             "|---|---|---|---|---|---|"]
    for p in data["points"]:
        loss = "" if p["loss"] is None else f"{p['loss']:.3f}"
        lines.append(f"| {p['step']} | {loss} | {p['sink_rate_no_self']:.3f} | "
                     f"{p['max_sink_score']:.3f} | {p['first_token_norm_ratio']:.2f} | "
                     f"{p['max_abs_resid']:.2f} |")
    return "\n".join([*lines, "", f"![timeline]({FIGURE})", ""])


def figure(data: dict[str, Any], path: Path) -> Path:
    from mechsink.viz.experiments import plot_timeline

    return plot_timeline(data, path)
