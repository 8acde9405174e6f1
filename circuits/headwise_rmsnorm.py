"""Does head-wise RMSNorm speed convergence and change the sink?

Methods: twin organisms (same recipe, seed, data and steps) with and without head-wise RMSNorm,
over several seeds; loss curves and sink timelines side by side; a paired verdict. The
computation is :func:`mechsink.experiments.headwise_rmsnorm.run`; the organisms are trained
under OUT/runs (an interrupted run resumes).

    python circuits/headwise_rmsnorm.py --out runs/hwrms [--recipe bb-gpt2-tiny] [--steps 2000]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mechsink.experiments import headwise_rmsnorm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipe", default="bb-gpt2-tiny")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()

    result = headwise_rmsnorm.run(work_dir=args.out, recipe=args.recipe, seeds=args.seeds,
                                  steps=args.steps)
    result.save(args.out)
    print(result.summary())


if __name__ == "__main__":
    main()
