"""Figures and pages made from saved results (they read the JSON, never recompute).

- :mod:`mechsink.viz.style`: the one matplotlib style (``styled()``, ``use_style``, ``save``).
- :mod:`mechsink.viz.figures`: census figures from ``census.json``.
- :mod:`mechsink.viz.attention`: circuitsvis attention views, offline. The module is callable:
  ``mechsink.viz.attention(cache, tokens, layer=5)`` shows a layer's heads inline in Jupyter.
- :mod:`mechsink.viz.gallery`: sink heads beside ordinary heads, for the docs gallery.
- :mod:`mechsink.viz.patching`: the heatmap of a patching result (``heatmap``, re-exported).
- :mod:`mechsink.viz.report`: the census report folder (``mechsink scan``).
- :mod:`mechsink.viz.experiments`: figures of the circuits scripts.
- :mod:`mechsink.viz.discover`: edge circuits and faithfulness curves (``mechsink discover``).
- :mod:`mechsink.viz.sweep`: the sink-rate figure of a merged sweep census.
"""

from mechsink.viz import attention
from mechsink.viz.attention import AttentionView
from mechsink.viz.patching import heatmap
from mechsink.viz.report import write_report

__all__ = ["AttentionView", "attention", "heatmap", "write_report"]
