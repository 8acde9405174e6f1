"""Why position 0 becomes the sink: variance discrepancy, super neurons, moving the sink
(Li, Jiang, Sun et al. 2026, "The Structural Origin of Attention Sink").

Methods: natural text with BOS; the dominant super neuron at position 0; its dose-response; the
sink moved to position k by a self-only mask, an amplified norm and a planted channel.
The computation is :func:`mechsink.experiments.structural_origin.run`.

    python circuits/structural_origin.py --model smollm2-135m --out runs/origin
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mechsink import load_model
from mechsink.experiments import structural_origin


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=16, help="natural sequences")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--positions", type=int, nargs="+", default=[8, 16, 32],
                        help="positions k the sink is moved to")
    parser.add_argument("--scales", type=float, nargs="+", default=[0.0, 0.5, 1.0, 1.5, 2.0, 3.0],
                        help="super-neuron scales of the dose-response")
    parser.add_argument("--seed", type=int, default=None, help="weights seed (random: models)")
    args = parser.parse_args()

    model = load_model(args.model, device="cpu", seed=args.seed)
    result = structural_origin.run(model, model_name=args.model, n=args.n, seq_len=args.seq_len,
                                   positions=args.positions, scales=args.scales)
    result.save(args.out)
    print(result.summary())


if __name__ == "__main__":
    main()
