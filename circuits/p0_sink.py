"""The P0-sink circuit (Peng, Li et al. 2026, "How Attention Sinks Emerge in Large Language
Models: An Interpretability Perspective").

Methods: natural text with BOS, without BOS and with a random first token; every head and MLP of
the early blocks (through the one that creates the massive channel, at least 4) plus its top
super neuron and its complete super-neuron set; each one's position-0 output path-patched to its
mean over later positions, followed through the creating MLP into the massive channel and into
the later sink layers, and directly into the sink, each next to the channel it leaves; the path
through the channel to saturation (the complete set's dose-response, channel surgery, 95%
intervals over prompts); total effects; the minimal circuit; verdicts with their criteria.
The computation is
:func:`mechsink.experiments.p0_sink.run`.

    python circuits/p0_sink.py --model smollm2-135m --out runs/p0
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mechsink import load_model
from mechsink.experiments import p0_sink
from mechsink.interventions.chain import DEFAULT_DOSES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=8, help="natural sequences")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--layers", type=int, default=None,
                        help="candidate blocks 0..layers-1 (default: through the super "
                        "neuron's, at least 4)")
    parser.add_argument("--batch-size", type=int, default=8, help="senders per path-patch batch")
    parser.add_argument("--doses", type=float, nargs="+", default=list(DEFAULT_DOSES),
                        help="factors the complete set is scaled by (with 0 and 1)")
    parser.add_argument("--seed", type=int, default=None, help="weights seed (random: models)")
    args = parser.parse_args()

    model = load_model(args.model, device="cpu", seed=args.seed)
    result = p0_sink.run(model, model_name=args.model, n=args.n, seq_len=args.seq_len,
                         layers=args.layers, batch_size=args.batch_size, doses=args.doses)
    result.save(args.out)
    print(result.summary())


if __name__ == "__main__":
    main()
