"""Figures and pages made from a census.json (they read the JSON, never recompute)."""

from mechsink.viz.report import write_report

__all__ = ["write_report"]
