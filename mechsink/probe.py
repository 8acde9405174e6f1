"""Deprecated name of :mod:`mechsink.readout` (it was not a linear probe); kept one release."""

from __future__ import annotations

import warnings
from typing import Any

from mechsink.readout import SinkReadout, dominant_super_neuron, sink_readout

__all__ = ["ProbeResult", "dominant_super_neuron", "probe"]

ProbeResult = SinkReadout


def probe(*args: Any, **kwargs: Any) -> SinkReadout:
    """Deprecated: use :func:`mechsink.readout.sink_readout`."""
    warnings.warn("mechsink.probe.probe is now mechsink.readout.sink_readout; the old name goes "
                  "in the next release.", DeprecationWarning, stacklevel=2)
    return sink_readout(*args, **kwargs)
