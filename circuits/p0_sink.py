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

from mechsink.experiments.script import main

if __name__ == "__main__":
    main("p0_sink", __doc__)
