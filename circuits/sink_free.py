"""Which attention variant removes the sink and the massive activation, and what does it cost?

Methods: twin organisms (same recipe, seed, batches and steps) with plain softmax attention and
each sink-free variant (softmax1, sink logit, gated, softpick, sigmoid, key/value bias), over
several seeds, on Bigram-Backcopy and on text; final loss, sink rate, largest sink score, largest
residual magnitude and first-token norm ratio with their spread over seeds, and each arm's sink
timeline; and, on each final checkpoint, streaming perplexity with a window of seq_len // 4
tokens and 0 or 1 first tokens kept (Xiao et al. 2024) and the loss change under weight-only
int4 round-to-nearest (Yu et al. 2024). The computation is
:func:`mechsink.experiments.sink_free.run`; the organisms are trained under OUT/runs (an
interrupted run resumes, a finished one is reused).

    python circuits/sink_free.py --out runs/sink_free [--recipes bb-llama-tiny text-llama-tiny]
        [--steps 6000 150] [--seeds 0 1 2] [--variants softmax1 softpick ...]

Plain ``bb-llama-tiny`` forms its sink late (largest sink score 0.07 at step 400, 0.14-0.31 at
step 6000 over seeds 0-2), hence its default length; the 21 Bigram-Backcopy organisms then take
about 1.5 CPU hours on a 2-core machine.
"""

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("sink_free", __doc__)
