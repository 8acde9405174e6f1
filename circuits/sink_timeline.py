"""When does the sink form during training? The sink measurements at every checkpoint.

Methods: every checkpoint of a run written by `mechsink train` reads the same held-out task
sequences; Gu's sink rate, the largest sink score, the first-token norm ratio and the largest
residual activation per checkpoint. The computation is
:func:`mechsink.experiments.sink_timeline.run`.

    mechsink train bb-gpt2-tiny --out runs/bb   # about 6000 steps; sinks form in layer 0
    python circuits/sink_timeline.py --run runs/bb --out runs/bb-timeline
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mechsink.experiments import sink_timeline
from mechsink.measure.sinks import DEFAULT_EPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="folder written by mechsink train")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--eps", type=float, default=DEFAULT_EPS)
    args = parser.parse_args()

    result = sink_timeline.run(run_dir=args.run, n=args.n, eps=args.eps)
    result.save(args.out)
    print(result.summary())


if __name__ == "__main__":
    main()
