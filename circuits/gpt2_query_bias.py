"""The query-bias circuit of GPT-2-style models (learned query bias, absolute positions).

Methods: the strongest sink heads; each one's attention logits split into the query-independent
Delta_j = b_Q . (x_j W_K) and the rest; the query bias, W_K's structure and the layer-0 MLP at
position 0 removed in turn, and the sink score measured again. The computation is
:func:`mechsink.experiments.gpt2_query_bias.run`.

    python circuits/gpt2_query_bias.py --model organism:bb-gpt2-tiny --out runs/qbias
"""

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("gpt2_query_bias", __doc__)
