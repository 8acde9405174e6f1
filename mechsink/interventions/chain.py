"""The causal chain *super neurons -> massive channel -> sink*, measured to saturation: one
namespace for the experiments (``from mechsink.interventions import chain``).

Effects in these models saturate: a massive channel at a quarter of its size can still dominate
the token's direction after RMSNorm, so one partial intervention can show nothing. Every
intervention is pushed to full removal and the whole curve is read. The parts, one module each:

- :mod:`mechsink.interventions.targets`: what a dose scales (:func:`neuron_set`,
  :func:`neuron_sets`, :func:`channel_set`, :func:`direction_set`);
- :mod:`mechsink.interventions.surgery`: the massive channel(s) at position 0, or the component
  along a direction, set to its median over positions 1.. (:func:`channel_surgery`,
  :func:`direction_surgery`, :func:`top_direction`);
- :mod:`mechsink.interventions.readout`: one run with edits, read per prompt (:func:`measure`);
- :mod:`mechsink.interventions.dose`: :func:`dose_response`, :func:`summarise` through a fixed
  :class:`Frame`, the half-effect dose;
- :mod:`mechsink.interventions.stats`: intervals over prompts (Student's t below 64 prompts,
  percentile bootstrap from there; paired for clean vs intervened) and the rule below which no
  verdict calls two intervals apart (:data:`MIN_N_APART`);
- :mod:`mechsink.interventions.set_validation`: every super-neuron set zeroed against a
  same-size random set of its block (:func:`validate_sets`): which block's set carries the sink;
- :mod:`mechsink.measure.logit_split`: :func:`key_logit_split`, the logit of a sink head split
  into the massive channel's part of the key, the rest, the key bias and the rotary term.

Sink score and rate: Gu et al. (2024), "When Attention Sink Emerges in Language Models"; super
neurons: Yu et al. (2024), "The Super Weight in Large Language Models"; massive activations:
Sun et al. (2024), "Massive Activations in Large Language Models".
"""

from __future__ import annotations

from mechsink.interventions.dose import (
    DEFAULT_DOSES,
    DoseResponse,
    Frame,
    HalfEffect,
    RunSummary,
    dose_response,
    half_effect_dose,
    make_frame,
    summarise,
)
from mechsink.interventions.readout import Readout, measure
from mechsink.interventions.set_validation import SetCheck, SetValidation, validate_sets
from mechsink.interventions.stats import (
    LEVEL,
    MIN_N_APART,
    N_BOOT,
    TOO_FEW,
    Interval,
    apart,
    bootstrap_interval,
    mean_interval,
    paired_interval,
    t_interval,
)
from mechsink.interventions.surgery import channel_surgery, direction_surgery, top_direction
from mechsink.interventions.targets import (
    Target,
    channel_set,
    direction_set,
    neuron_set,
    neuron_sets,
)
from mechsink.measure.logit_split import KeyLogitSplit, LogitParts, key_logit_split

__all__ = [
    "DEFAULT_DOSES",
    "LEVEL",
    "MIN_N_APART",
    "N_BOOT",
    "TOO_FEW",
    "DoseResponse",
    "Frame",
    "HalfEffect",
    "Interval",
    "KeyLogitSplit",
    "LogitParts",
    "Readout",
    "RunSummary",
    "SetCheck",
    "SetValidation",
    "Target",
    "apart",
    "bootstrap_interval",
    "channel_set",
    "channel_surgery",
    "direction_set",
    "direction_surgery",
    "dose_response",
    "half_effect_dose",
    "key_logit_split",
    "make_frame",
    "mean_interval",
    "measure",
    "neuron_set",
    "neuron_sets",
    "paired_interval",
    "summarise",
    "t_interval",
    "top_direction",
    "validate_sets",
]
