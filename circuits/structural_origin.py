"""Why position 0 becomes the sink: variance discrepancy, complete super-neuron sets, the causal
chain measured to saturation, moving the sink (Li, Jiang, Sun et al. 2026, "The Structural Origin
of Attention Sink").

Methods: natural text with BOS; the massive channel at position 0 and the complete set of
neurons that writes it in the block that creates it; that set (and every set that builds the
channel) scaled from full removal to 3x, with 95% bootstrap intervals over prompts; channel
surgery (the channel at position 0 set to an ordinary token's value); the key logit of the
strongest sink heads split into its parts; the sink moved to position k by a self-only mask,
an amplified norm and a planted channel. Each verdict carries its criterion.
The computation is :func:`mechsink.experiments.structural_origin.run`.

    python circuits/structural_origin.py --model smollm2-135m --out runs/origin
"""

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("structural_origin", __doc__)
