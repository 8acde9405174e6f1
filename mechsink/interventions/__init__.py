"""Interventions: the ablation vocabulary, declared edits, readouts under edits, and the causal
chain measured to saturation (dose-response and surgery).

- :mod:`mechsink.interventions.ablation`: what replaces a switched-off activation (zero,
  batch_mean, position_mean, resample), shared with patching.
- :mod:`mechsink.interventions.edits`: declared edits (:func:`ablate`, :func:`attend_only_to_self`,
  :func:`scale_tokens`, ...) and :func:`applied`, which installs them for a ``with`` block.
- :mod:`mechsink.interventions.readout`: run with edits in place and read the sinks and channels
  (the one readout, on :func:`mechsink.measure.forward.measure_forward`).
- :mod:`mechsink.interventions.targets`, :mod:`~mechsink.interventions.surgery`,
  :mod:`~mechsink.interventions.dose`, :mod:`~mechsink.interventions.stats`: what a dose scales,
  surgery at position 0, dose-responses to saturation, bootstrap intervals over prompts.
- :mod:`mechsink.interventions.chain`: all of the causal chain's names in one namespace.
"""

from mechsink.interventions.ablation import Ablation, as_ablation
from mechsink.interventions.edits import (
    Intervention,
    ablate,
    applied,
    attend_only_to_self,
    remove_bos,
    remove_key_bias,
    remove_query_bias,
    replace_first,
    rotate_keys,
    scale_tokens,
    shift_to_first,
)

__all__ = [
    "Ablation", "Intervention", "ablate", "applied", "as_ablation", "attend_only_to_self",
    "remove_bos", "remove_key_bias", "remove_query_bias", "replace_first", "rotate_keys",
    "scale_tokens", "shift_to_first",
]
