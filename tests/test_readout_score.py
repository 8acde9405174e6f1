"""SinkReadout.score(position): the per-head sink score of a key position, the same reading as
SinkScores.score(), checked against attention patterns read with TransformerLens's own cache."""

from __future__ import annotations

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.interventions.readout import sink_readout
from mechsink.model import load_model


def test_readout_score_is_the_mean_attention_on_the_key_from_queries_at_and_after_it() -> None:
    model = load_model("random:llama-tiny", seed=0)
    tokens = torch.randint(1, 100, (3, 10), generator=torch.Generator().manual_seed(0))
    read = sink_readout(model, tokens, positions=[0, 2])
    _, cache = model.run_with_cache(tokens)
    for k in (0, 2):
        by_hand = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"][:, :, k:, k]
                               .mean(-1).mean(0) for layer in range(model.cfg.n_layers)])
        torch.testing.assert_close(read.score(k).double(), by_hand.double(), rtol=1e-5,
                                   atol=1e-6)
        assert read.mean_score(k) == pytest.approx(float(by_hand.mean()), rel=1e-5)
    assert read.score().shape == (model.cfg.n_layers, model.cfg.n_heads)
    with pytest.raises(BadInputError, match="position 5 was not read"):
        read.score(5)
