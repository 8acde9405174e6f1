"""Sink rates under Gu et al.'s protocol (Gu, Pang, Du et al. 2024, "When Attention Sink Emerges
in Language Models: An Empirical View").

Methods: the sink rate at key position 0 (the share of heads whose mean attention to the first
token, queries i >= 0, exceeds eps = 0.3, thresholded per sequence) at T = 64 on natural text,
random tokens and one repeated token, each with the model's BOS token first and without it;
n = 32 sequences per suite with 95% intervals over sequences; the same without query 0; the
paper's rows for its own models quoted beside them. The computation is
:func:`mechsink.experiments.sink_protocol.run`.

    python circuits/sink_protocol.py --model smollm2-135m --out runs/sink-protocol
"""

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("sink_protocol", __doc__)
