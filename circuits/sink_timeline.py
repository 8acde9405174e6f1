"""C5 over training: the sink measurements at every checkpoint of an organism run.

    mechsink train bb-gpt2-tiny --out runs/bb   # about 6000 steps; sinks form in layer 0
    python circuits/sink_timeline.py --run runs/bb --out runs/bb-timeline

Every checkpoint reads the same held-out sequences (the run's task for Bigram-Backcopy runs,
random ordinary tokens after BOS otherwise).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from mechsink.timeline import sink_timeline, write_timeline
from mechsink.training import get_recipe
from mechsink.viz.experiments import plot_timeline


def held_out_tokens(run_dir: Path, n: int) -> torch.Tensor:
    run = json.loads((run_dir / "run.json").read_text())
    recipe = get_recipe(run["recipe"]["name"])
    return recipe.task().batch(10_000, 0, n, recipe.seq_len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="folder written by mechsink train")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--eps", type=float, default=0.3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    points = sink_timeline(args.run, held_out_tokens(args.run, args.n), eps=args.eps)
    path = write_timeline(points, args.out / "timeline.json", run=str(args.run), eps=args.eps)
    plot_timeline(json.loads(path.read_text()), args.out / "timeline.png")
    print("| step | loss | sink rate | largest sink score | norm ratio | max abs resid |")
    print("|---|---|---|---|---|---|")
    for p in points:
        loss = "" if p.loss is None else f"{p.loss:.3f}"
        print(f"| {p.step} | {loss} | {p.sink_rate_no_self:.3f} | {p.max_sink_score:.3f} | "
              f"{p.first_token_norm_ratio:.2f} | {p.max_abs_resid:.2f} |")


if __name__ == "__main__":
    main()
