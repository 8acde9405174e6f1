"""Edge-level circuit discovery: the edge graph, EAP / EAP-IG / exact edge scores, AtP*'s QK
fix, circuit selection and faithfulness curves.

:class:`GraphRun` sets a call up once (tokens, metric, corruption); :func:`eap`,
:func:`eap_ig` and :func:`exact_scores` score every edge; :mod:`mechsink.discover.circuit`
picks and evaluates circuits; :mod:`mechsink.discover.plot` draws them.
"""

from mechsink.discover.graph import Graph, MetricPoint, Receiver, Sender, metric_point
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
    "METHODS", "EdgeScores", "Graph", "GraphRun", "MetricPoint", "Receiver", "Sender", "eap",
    "eap_ig", "exact_scores", "graph_mode", "metric_point", "score_edges", "spearman",
]
