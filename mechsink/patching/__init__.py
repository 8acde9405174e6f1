"""Patching: exact batched activation patching, path patching, attribution patching.

Sites say what to patch, senders and receivers (:mod:`mechsink.patching.nodes`) which paths,
metrics what to measure (logits or sink quantities), ablations
(:mod:`mechsink.interventions.ablation`) what replaces a switched-off activation, and every sweep
returns a :class:`PatchResult`. All three (and edge discovery) run the one loop of
:mod:`mechsink.patching.engine`, batched by :mod:`mechsink.patching.plan`. Draw a result with
:func:`mechsink.viz.patching.heatmap`.
"""

from mechsink.interventions.ablation import Ablation
from mechsink.patching.activation import activation_patch
from mechsink.patching.attribution import attribution_patch, compare_to_exact
from mechsink.patching.batches import pad_prompts
from mechsink.patching.compare import EffectComparison, path_vs_direct
from mechsink.patching.every import block_every
from mechsink.patching.metrics import (
    KLToClean,
    LogitDiff,
    LogitsMetric,
    LogProb,
    MassiveValue,
    Metric,
    Needs,
    Outputs,
    ResidNorm,
    SinkScore,
    as_metric,
    parse_metric,
)
from mechsink.patching.nodes import Receiver, Sender, parse_component, parse_receiver
from mechsink.patching.path import path_patch
from mechsink.patching.result import PatchResult
from mechsink.patching.sites import Site, parse_site

__all__ = [
    "Ablation", "EffectComparison", "KLToClean", "LogProb", "LogitDiff", "LogitsMetric",
    "MassiveValue", "Metric", "Needs", "Outputs", "PatchResult", "Receiver", "ResidNorm",
    "Sender", "Site", "SinkScore", "activation_patch", "as_metric", "attribution_patch",
    "block_every", "compare_to_exact", "pad_prompts", "parse_component", "parse_metric",
    "parse_receiver", "parse_site", "path_patch", "path_vs_direct",
]
