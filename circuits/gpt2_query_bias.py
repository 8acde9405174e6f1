"""The query-bias circuit of GPT-2-style models (learned query bias, absolute positions).

Methods: the strongest sink heads; each one's attention logits split into the query-independent
Delta_j = b_Q . (x_j W_K) and the rest; the query bias, W_K's structure and the layer-0 MLP at
position 0 removed in turn, and the sink score measured again. The computation is
:func:`mechsink.experiments.gpt2_query_bias.run`.

    python circuits/gpt2_query_bias.py --model organism:bb-gpt2-tiny --out runs/qbias
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mechsink import load_model
from mechsink.experiments import gpt2_query_bias


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="organism:bb-gpt2-tiny")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--top", type=int, default=4, help="number of sink heads to study")
    args = parser.parse_args()

    model = load_model(args.model, device="cpu")
    result = gpt2_query_bias.run(model, model_name=args.model, n=args.n, seq_len=args.seq_len,
                                 top=args.top)
    result.save(args.out)
    print(result.summary())


if __name__ == "__main__":
    main()
