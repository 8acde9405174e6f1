"""Which first token an experiment traces the sink on.

Gu et al. (2024, "When Attention Sink Emerges in Language Models: An Empirical View") measure the
sink with a BOS token first, and so does mechsink by default. A model trained without one can
have no sink at key 0 behind a BOS token: Qwen2.5-0.5B's sink rate there is 0.02 with BOS and
0.56 without, and its massive channel only exists without. A circuit traced on the variant
without a sink explains nothing and searches every block for a channel that is not there, so the
causal-chain experiments trace the sink where the model has it (:func:`choose_variant`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jaxtyping import Int
from torch import Tensor

from mechsink.inputs.prompts import VARIANTS, make_prompts
from mechsink.interventions.readout import sink_readout
from mechsink.model.tokens import bos_token_id

#: below this sink rate at key 0 there is no sink to trace (the experiments' floor)
SINK_FLOOR = 0.05


def choose_variant(rates: Mapping[str, float], min_rate: float = SINK_FLOOR) -> str:
    """BOS where the model has a sink at key 0 behind it (a rate of at least ``min_rate``),
    else the variant whose sink rate is largest (BOS first among equals)."""
    if not rates:
        raise ValueError("no first-token variant was measured")
    if rates.get("bos", 0.0) >= min_rate:
        return "bos"
    order = [v for v in VARIANTS if v in rates]
    return max(order, key=lambda v: (rates[v], -order.index(v)))


def first_token_variants(model: Any) -> tuple[str, ...]:
    """The variants this model's tokenizer can build (no ``bos`` without a BOS token)."""
    return VARIANTS if bos_token_id(model) is not None else tuple(
        v for v in VARIANTS if v != "bos")


def traced_prompts(model: Any, n: int, seq_len: int, *, suite: str = "natural"
                   ) -> tuple[str, dict[str, float], dict[str, Int[Tensor, "batch pos"]]]:
    """The variant to trace (:func:`choose_variant`), every variant's sink rate at key 0 (the
    queries after it, one forward each) and every variant's prompts."""
    tokens = {v: make_prompts(model, suite, v, n=n, seq_len=seq_len).tokens
              for v in first_token_variants(model)}
    rates = {v: sink_readout(model, t, positions=[0], include_self=False).rates[0]
             for v, t in tokens.items()}
    return choose_variant(rates), rates, tokens
