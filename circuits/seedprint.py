"""Structure at random initialisation, and SeedPrint (Li, Tong, Wang et al. 2026).

Methods: token preference on random input across families, depths and init schemes; the
contraction direction across seeds and inputs; SeedPrint between organisms that share or do not
share an initialisation; SeedPrint's threshold calibrated on a null of independent
initialisations trained on the same data, with false-positive and false-negative rates on
held-out organisms. The computation is :func:`mechsink.experiments.seedprint.run`; the
organisms are trained under OUT/runs.

    python circuits/seedprint.py --out runs/seedprint [--steps 200] [--null-inits 6]
        [--held-out-inits 4] [--alpha 0.01]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mechsink.experiments import seedprint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipe", default="bb-llama-tiny")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--size", default="mini", help="random-model size for parts 1 and 2")
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--null-inits", type=int, default=6,
                        help="independent initialisations trained on one data order (the null)")
    parser.add_argument("--held-out-inits", type=int, default=4,
                        help="initialisations each trained on two data orders (the test pairs)")
    parser.add_argument("--alpha", type=float, default=0.01,
                        help="false-positive rate the calibrated threshold aims for")
    args = parser.parse_args()

    result = seedprint.run(work_dir=args.out, recipe=args.recipe, steps=args.steps,
                           size=args.size, depths=args.depths, n=args.n, k=args.k,
                           null_inits=args.null_inits, held_out_inits=args.held_out_inits,
                           alpha=args.alpha)
    result.save(args.out)
    print(result.summary())


if __name__ == "__main__":
    main()
