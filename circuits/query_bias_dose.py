"""The query-bias circuit, dosed: does the query bias make key 0 win, or does it change every
query?

Methods: in the layers of the strongest sink heads, scale each part from full removal (0) to
three times its size: b_Q (every query changes), only b_Q . k_0 in the logits to key 0 (every
other logit untouched), the layer-0 MLP's output at position 0, and W_K's structure (keys
interpolated toward a random rotation); per dose the sink heads' score at key 0, the sink rate and
the loss with 95% bootstrap intervals over prompts. The computation is
:func:`mechsink.experiments.query_bias_dose.run`.

    python circuits/query_bias_dose.py qwen2.5-0.5b --out runs/c6 [--n 16] [--seq-len 64]
"""

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("query_bias_dose", __doc__)
