"""Measurements: pure functions of cached activations (no model calls), per SCIENCE.md."""

from mechsink.measure.sinks import sink_rate, sink_score

__all__ = ["sink_rate", "sink_score"]
