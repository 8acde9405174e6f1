"""Measure sinks and a residual channel under a set of interventions, in one forward.

The causal-chain experiments (claims C1-C4) ask the same question many times: with these
edits in place, how much do later queries attend to key ``k``, and how large is channel ``c``
at position ``k``? :func:`probe` answers it from one cached forward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.interventions import Intervention, applied
from mechsink.measure import sink_scores

DEFAULT_EPS = 0.3


@dataclass(frozen=True)
class ProbeResult:
    """Sink scores (queries after the key) per key position, and one channel's values."""

    scores: dict[int, Float[Tensor, "layer head"]]  # mean over sequences
    rates: dict[int, float]  # fraction of (layer, head) above eps, per sequence, averaged
    channel: int | None
    channel_values: dict[int, Float[Tensor, " layer"]]  # resid_post[l, k, channel], mean

    def mean_score(self, key_pos: int) -> float:
        return self.scores[key_pos].mean().item()

    def to_dict(self) -> dict[str, Any]:
        return {"sink_score_mean": {k: self.mean_score(k) for k in self.scores},
                "sink_rate": dict(self.rates),
                "channel": self.channel,
                "channel_values": {k: v.tolist() for k, v in self.channel_values.items()}}


@torch.no_grad()
def probe(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    interventions: Sequence[Intervention] = (),
    *,
    key_positions: Sequence[int] = (0,),
    channel: int | None = None,
    eps: float = DEFAULT_EPS,
) -> ProbeResult:
    """Run ``tokens`` once with ``interventions`` and measure the sinks at ``key_positions``."""
    wanted = ("attn.hook_pattern", "hook_resid_post")
    with applied(model, list(interventions)):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(wanted))
    scores, rates, values = {}, {}, {}
    for k in key_positions:
        s = sink_scores(cache, key_pos=k, eps=eps)
        scores[k], rates[k] = s.no_self.mean(0), s.rate_no_self
        if channel is not None:
            values[k] = torch.stack([cache[f"blocks.{layer}.hook_resid_post"][:, k, channel]
                                     for layer in range(model.cfg.n_layers)], 1).mean(0).cpu()
    return ProbeResult(scores, rates, channel, values)
