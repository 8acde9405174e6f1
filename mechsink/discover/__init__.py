"""Edge-level circuit discovery: the edge graph, EAP / EAP-IG / exact edge scores, AtP*'s QK
fix, circuit selection and faithfulness curves.

:class:`GraphRun` (:mod:`mechsink.discover.graph_run`) sets a call up once (tokens, metric,
corruption); the methods of :mod:`mechsink.discover.methods` (one file each, registered by
name: :func:`eap`, :func:`eap_ig`, :func:`exact_scores`; :func:`score_edges` calls one by
name) score every edge; :mod:`mechsink.discover.circuit` picks and evaluates circuits,
:mod:`mechsink.discover.curves` draws their curves with a random baseline,
:mod:`mechsink.viz.discover` draws both; :func:`discover` does it all.
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
from mechsink.discover.export import load_edge_list, save_edge_list
from mechsink.discover.graph import Graph, MetricPoint, metric_point, parse_neurons
from mechsink.discover.graph_run import GraphRun, graph_mode
from mechsink.discover.methods import METHODS, register, score_edges
from mechsink.discover.methods.eap import eap
from mechsink.discover.methods.eap_ig import eap_ig
from mechsink.discover.methods.exact import exact_scores
from mechsink.discover.pipeline import Discovery, discover
from mechsink.discover.scores import EdgeScores
from mechsink.patching.nodes import Receiver, Sender

__all__ = [
    "METHODS", "Circuit", "Curve", "Discovery", "EdgeScores", "Graph", "GraphRun",
    "MetricPoint", "Receiver", "Sender", "auc", "curve", "default_sizes", "discover", "eap",
    "eap_ig", "edges_from_names", "exact_scores", "faithfulness", "graph_mode", "greedy",
    "load_edge_list", "metric_point", "node_circuit_edges", "parse_neurons", "register",
    "save_edge_list", "score_edges", "sets_curve", "top_n",
]
