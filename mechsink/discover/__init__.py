"""Edge-level circuit discovery: the edge graph, EAP / EAP-IG / exact edge scores, AtP*'s QK
fix, circuit selection and faithfulness curves.

:class:`GraphRun` (:mod:`mechsink.discover.graph_run`) sets a call up once (tokens, metric,
corruption); the methods of :mod:`mechsink.discover.methods` (one file each, registered by
name: :func:`eap`, :func:`eap_ig`, :func:`exact_scores`; :func:`score_edges` calls one by
name) score every edge; :mod:`mechsink.discover.circuit` picks and evaluates circuits,
:mod:`mechsink.discover.curves` draws their curves with a random baseline,
:mod:`mechsink.viz.discover` draws both; :func:`discover` does it all.

The names below import on first use, so reading the method registry (as the command line does
at start-up) does not pull in torch.
"""

from mechsink.lazy import lazy_names

# name -> the module that defines it
_LAZY = {
    **dict.fromkeys(("Circuit", "edges_from_names", "faithfulness", "greedy",
                     "node_circuit_edges", "top_n"), "mechsink.discover.circuit"),
    **dict.fromkeys(("Curve", "auc", "curve", "default_sizes", "sets_curve"),
                    "mechsink.discover.curves"),
    **dict.fromkeys(("load_edge_list", "save_edge_list"), "mechsink.discover.export"),
    **dict.fromkeys(("Graph", "MetricPoint", "metric_point", "parse_neurons"),
                    "mechsink.discover.graph"),
    **dict.fromkeys(("GraphRun", "graph_mode"), "mechsink.discover.graph_run"),
    **dict.fromkeys(("METHODS", "register", "score_edges"), "mechsink.discover.methods"),
    "eap": "mechsink.discover.methods.eap",
    "eap_ig": "mechsink.discover.methods.eap_ig",
    "exact_scores": "mechsink.discover.methods.exact",
    **dict.fromkeys(("Discovery", "discover"), "mechsink.discover.pipeline"),
    "EdgeScores": "mechsink.discover.scores",
    **dict.fromkeys(("Receiver", "Sender"), "mechsink.patching.nodes"),
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())

__all__ = [
    "METHODS", "Circuit", "Curve", "Discovery", "EdgeScores", "Graph", "GraphRun",
    "MetricPoint", "Receiver", "Sender", "auc", "curve", "default_sizes", "discover", "eap",
    "eap_ig", "edges_from_names", "exact_scores", "faithfulness", "graph_mode", "greedy",
    "load_edge_list", "metric_point", "node_circuit_edges", "parse_neurons", "register",
    "save_edge_list", "score_edges", "sets_curve", "top_n",
]
