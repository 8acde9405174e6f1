"""Edge-level circuit discovery: the edge graph, EAP / EAP-IG / exact edge scores, AtP*'s QK
fix, circuit selection and faithfulness curves.

:class:`GraphRun` sets a call up once (tokens, metric, corruption); :func:`eap`,
:func:`eap_ig` and :func:`exact_scores` score every edge; :mod:`mechsink.discover.circuit`
picks and evaluates circuits, :mod:`mechsink.discover.curves` draws their curves with a
random baseline, :mod:`mechsink.viz.discover` draws both; :func:`discover` does it all.
"""

from mechsink.discover.circuit import (
    Circuit,
    edges_from_names,
    faithfulness,
    greedy,
    node_circuit_edges,
    top_n,
)
from mechsink.discover.curves import Curve, auc, curve, default_sizes, sets_curve
from mechsink.discover.graph import Graph, MetricPoint, Receiver, Sender, metric_point
from mechsink.discover.pipeline import Discovery, discover
from mechsink.discover.run import GraphRun, graph_mode
from mechsink.discover.scores import (
    METHODS,
    EdgeScores,
    eap,
    eap_ig,
    exact_scores,
    score_edges,
    spearman,
)

__all__ = [
    "METHODS", "Circuit", "Curve", "Discovery", "EdgeScores", "Graph", "GraphRun",
    "MetricPoint", "Receiver", "Sender", "auc", "curve", "default_sizes", "discover", "eap",
    "eap_ig", "edges_from_names", "exact_scores", "faithfulness", "graph_mode", "greedy",
    "metric_point", "node_circuit_edges", "score_edges", "sets_curve", "spearman", "top_n",
]
