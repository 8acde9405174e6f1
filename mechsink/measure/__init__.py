"""Measurements, one module each: most are pure functions of cached activations; the few that
run the model say so below.

Each cache measurement module holds one measurement: its hook suffixes (``HOOKS``), a function
of a cache (a mapping of hook name -> tensor) and a frozen result with ``merge`` (chunks of
sequences) and ``to_dict`` (JSON). Around them:

- :mod:`mechsink.measure.cache`: reading per-layer activations out of a cache (stacking the
  layers, rounding results), shared by every measurement and by the interventions' readouts;
- :mod:`mechsink.measure.forward`: the one forward that caches only what the measurements read
  and merges them over chunks (:func:`~mechsink.measure.forward.measure_forward`);
- :mod:`mechsink.measure.registry`: the census's measurements, one entry each;
- :mod:`mechsink.measure.census` and :mod:`mechsink.measure.timeline`: the census of a model
  and the sink measurements over a training run;
- :mod:`mechsink.measure.logit_split`: exact splits of an attention logit into parts (runs
  the model); :mod:`mechsink.measure.query_bias`: the GPT-2 query-bias algebra;
- :mod:`mechsink.measure.seedprint`: structure at random initialisation and the SeedPrint
  identity test (builds and runs random-init models).
"""

from mechsink.measure.keys import KeyBiasCosine, key_bias_cosine
from mechsink.measure.massive import (
    MassiveHits,
    MassiveReport,
    find_massive,
    massive_activations,
)
from mechsink.measure.norms import (
    HeadNorms,
    PerSequence,
    first_token_norm_ratio,
    head_output_norms,
    value_drain,
)
from mechsink.measure.sinks import SinkScores, sink_rate, sink_score, sink_scores
from mechsink.measure.super_neurons import (
    MlpSpikes,
    SuperNeuronSet,
    SuperNeuronSets,
    mlp_spikes,
    super_neuron_sets,
)
from mechsink.measure.variance import VarianceStats, variance_stats

__all__ = [
    "HeadNorms",
    "KeyBiasCosine",
    "MassiveHits",
    "MassiveReport",
    "MlpSpikes",
    "PerSequence",
    "SinkScores",
    "SuperNeuronSet",
    "SuperNeuronSets",
    "VarianceStats",
    "find_massive",
    "first_token_norm_ratio",
    "head_output_norms",
    "key_bias_cosine",
    "massive_activations",
    "mlp_spikes",
    "sink_rate",
    "sink_score",
    "sink_scores",
    "super_neuron_sets",
    "value_drain",
    "variance_stats",
]
