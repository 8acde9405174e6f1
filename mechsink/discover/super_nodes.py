"""The census's complete super-neuron sets as discovery's neuron nodes (``neurons="super"``).

:func:`mechsink.interventions.readout.massive_channel_sets` finds the massive channel at
position 0 and, for every block whose MLP writes it, the fewest neurons explaining 95% of that
write (Yu et al. 2024, "The Super Weight in Large Language Models", made complete). Those sets,
in the blocks the graph holds, become neuron senders, so the P0 edge circuit can name them.
"""

from __future__ import annotations

from typing import Any

from jaxtyping import Int
from torch import Tensor

from mechsink.discover.graph import MetricPoint


def super_neuron_nodes(model: Any, tokens: Int[Tensor, "batch pos"], point: MetricPoint
                       ) -> dict[int, list[int]]:
    """Layer -> the complete super-neuron set of each block whose MLP writes the massive
    channel at position 0 and writes before ``point`` (the metric) reads."""
    from mechsink.interventions.readout import massive_channel_sets

    found = massive_channel_sets(model, tokens)
    return {layer: sorted(int(n) for n, _ in s.neurons) for layer, s in found.sets.items()
            if 2 * layer + 2 < point.stage and s.neurons}
