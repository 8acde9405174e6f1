"""Inputs: prompt suites (natural, random, repeated x first-token variants), the real-text
corpus, and the organisms' training tasks.

- :mod:`mechsink.inputs.prompts`: :func:`make_prompts` and :class:`PromptSet`.
- :mod:`mechsink.inputs.corpus`: English text shipped in registry packages.
- :mod:`mechsink.inputs.tasks`: Bigram-Backcopy and the text stream organisms train on.
"""

from mechsink.inputs.prompts import SUITES, VARIANTS, PromptSet, make_prompts

__all__ = ["SUITES", "VARIANTS", "PromptSet", "make_prompts"]
