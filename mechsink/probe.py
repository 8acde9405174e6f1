"""Deprecated name of :mod:`mechsink.readout` (it was not a linear probe); kept one release."""

from __future__ import annotations

import warnings
from typing import Any

from mechsink.names import MechsinkDeprecationWarning
from mechsink.readout import SinkReadout, dominant_super_neuron, sink_readout

__all__ = ["ProbeResult", "dominant_super_neuron", "probe"]

ProbeResult = SinkReadout


def probe(*args: Any, **kwargs: Any) -> SinkReadout:
    """Deprecated: use :func:`mechsink.readout.sink_readout`. Keeps its old sink score (queries
    after the key only: ``include_self=False``); ``sink_readout`` defaults to Gu's version."""
    warnings.warn("mechsink deprecation: mechsink.probe.probe is now "
                  "mechsink.readout.sink_readout(..., include_self=False); the old name goes in "
                  "the next release.", MechsinkDeprecationWarning, stacklevel=2)
    kwargs.setdefault("include_self", False)
    return sink_readout(*args, **kwargs)
