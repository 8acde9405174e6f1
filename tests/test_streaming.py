"""Streaming perplexity: against a plain loop over windows with transformers' own model and its
own KV cache (one token at a time), clean and with a super-neuron set zeroed at position 0."""

from __future__ import annotations

import math

import pytest
import torch
from typer.testing import CliRunner

from mechsink.errors import BadInputError
from mechsink.interventions.streaming import (
    check_streaming_args,
    perplexity_table,
    streaming_perplexity,
    window_tokens,
)

WINDOWS, SINKS = (3, 6), (0, 1, 2)
NEURONS = [1, 5, 9]  # zeroed in MLP 0 at position 0


def _text(n: int = 20) -> torch.Tensor:
    return torch.randint(0, 50257, (n,), generator=torch.Generator().manual_seed(7))


def test_window_tokens_are_the_first_tokens_then_the_recent_ones():
    text = torch.arange(100, 120)
    got = window_tokens(text, [9, 15], sinks=2, window=4)
    assert got.tolist() == [[100, 101, 105, 106, 107, 108], [100, 101, 111, 112, 113, 114]]
    assert window_tokens(text, [9], sinks=0, window=4).tolist() == [[105, 106, 107, 108]]
    with pytest.raises(BadInputError, match="full window"):
        window_tokens(text, [5], sinks=2, window=4)


def _plain_nll(hf, text, t, sinks, window, zero_first=False):
    """-log p(text[t]) from transformers' model fed the window one token at a time through its
    own DynamicCache (positions 0..), MLP 0's NEURONS zeroed at position 0 when asked."""
    from transformers import DynamicCache

    context = torch.cat([text[:sinks], text[t - window:t]]) if window else text[:t]
    cache, first = DynamicCache(), [zero_first]

    def zero(module, args):
        if first[0]:
            x = args[0].clone()
            x[:, 0, NEURONS] = 0.0
            first[0] = False
            return (x,)
        return None

    handle = hf.model.layers[0].mlp.down_proj.register_forward_pre_hook(zero)
    try:
        with torch.no_grad():
            for token in context:
                out = hf(token.view(1, 1), cache=cache, use_cache=True)
    finally:
        handle.remove()
    return -torch.log_softmax(out.logits[0, -1].double(), -1)[text[t]].item()


@pytest.mark.parametrize("edited", [False, True])
def test_perplexity_table_matches_a_plain_loop_with_transformers_cache(llama_tiny, edited):
    from mechsink.interventions.targets import neuron_set
    from mechsink.model.zoo import random_hf_model

    text = _text()
    edits = neuron_set(llama_tiny, 0, NEURONS).edits(0.0) if edited else ()
    dense, table = perplexity_table(llama_tiny, text, WINDOWS, SINKS, edits=edits,
                                    batch_size=3)
    hf, _ = random_hf_model("llama-tiny", seed=0)
    targets = range(max(WINDOWS) + max(SINKS), len(text))
    for s in SINKS:
        for w in WINDOWS:
            nll = [_plain_nll(hf, text, t, s, w, edited) for t in targets]
            assert table[s][w] == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-4)
    nll = [_plain_nll(hf, text, t, 0, 0, edited) for t in targets]
    assert dense == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-4)
    if edited:  # the edit changed something (the test would pass vacuously otherwise)
        clean = perplexity_table(llama_tiny, text, WINDOWS, SINKS)[1]
        assert clean[0][3] != pytest.approx(table[0][3], rel=1e-6)


def test_streaming_perplexity_result_and_bad_input(llama_tiny):
    got = streaming_perplexity(llama_tiny, windows=WINDOWS, sinks=SINKS, tokens=_text(),
                               circuit=False, model_name="random:llama-tiny")
    data = got.to_dict()
    assert data["scored"] == 20 - 8 and set(data["perplexity"]) == {"0", "1", "2"}
    assert data["circuit_removed"] is None and len(data["first_tokens"]) == 2
    for args, match in [(((), (0,), 30), "windows"), (((4,), (-1,), 30), "sinks"),
                        (((16,), (4,), 20), "scores nothing"),
                        (((4,), (1,), 300), "context")]:
        with pytest.raises(BadInputError, match=match):
            check_streaming_args(*args, context=128)


def test_streaming_cli_writes_json_and_figure(tmp_path):
    from mechsink.app.cli import app

    out = tmp_path / "s"
    args = ["streaming", "random:llama-tiny", "--out", str(out), "--window", "4",
            "--window", "8", "--sinks", "0", "--sinks", "1", "--n-tokens", "24",
            "--no-circuit"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (out / "streaming.json").is_file() and (out / "streaming.png").is_file()
    bad = CliRunner().invoke(app, [*args[:4], "--window", "0"])
    assert bad.exit_code == 2 and "windows" in bad.output


def test_streaming_text_starts_with_bos_only_when_asked(llama_tiny):
    from mechsink.interventions.streaming import streaming_text
    from mechsink.model import bos_token_id

    bos = bos_token_id(llama_tiny)
    with_bos = streaming_text(llama_tiny, 40, bos=True)
    without = streaming_text(llama_tiny, 40, bos=False)
    assert with_bos.shape == without.shape == (40,)
    assert with_bos[0].item() == bos and without[0].item() != bos
    assert with_bos[1:].tolist() == without[:-1].tolist()  # the same text, shifted by one
    assert streaming_text(llama_tiny, 40).tolist() == with_bos.tolist()  # default: the BOS
