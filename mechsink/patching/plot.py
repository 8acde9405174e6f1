"""The heatmap of a PatchResult; it lives in :mod:`mechsink.viz.patching` (kept importable here)."""

from mechsink.viz.patching import heatmap

__all__ = ["heatmap"]
