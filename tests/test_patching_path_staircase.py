"""Path patching on the staircase (#26 item 3): sender groups of several blocks share one
forward, each copy joining at its own block, and senders at positions >= p reuse the clean
prefix. Every value equals path patching one group per forward with both switched off
(the slow path); a model whose batch cannot grow mid-forward falls back to one start per
batch and gives the same values."""

from __future__ import annotations

import pytest
import torch

from mechsink.model import capabilities
from mechsink.patching import LogitDiff, MassiveValue, engine, path_patch
from mechsink.patching.path import _batches

CLEAN = torch.randint(5, 500, (2, 7), generator=torch.Generator().manual_seed(0))
CORR = torch.randint(5, 500, (2, 7), generator=torch.Generator().manual_seed(1))


def senders(at: str = "") -> list:
    out = ["embed" + at, "L0H1" + at, "MLP0" + at, "L0N5" + at, "L1H2" + at, "L1H3" + at,
           ["L0H0" + at, "L1H0" + at], "MLP1" + at]
    return out


def slow(monkeypatch, *args, **kw):
    with monkeypatch.context() as m:
        m.setitem(engine.SPEEDUPS, "staircase", False)
        m.setitem(engine.SPEEDUPS, "prefix_reuse", False)
        return path_patch(*args, **kw, batch_size=1)


@pytest.mark.parametrize("fixture", ["llama_tiny", "gpt2_tiny"])
@pytest.mark.parametrize("receivers", [["L1H1.q"], ["L1H0.v", "MLP1"], ["metric"]])
@pytest.mark.parametrize("at", ["", "@3"])
def test_staircase_and_prefix_equal_the_slow_path(request, monkeypatch, fixture, receivers,
                                                  at):
    model = request.getfixturevalue(fixture)
    metric = LogitDiff(11, 12)
    group = senders(at)
    if receivers != ["metric"]:  # senders after the receivers do not reach them
        group = [g for g in group if "1" not in str(g)[:3] or receivers == ["MLP1"]]
    fast = path_patch(model, CLEAN, CORR, group, receivers, metric, batch_size=16)
    ref = slow(monkeypatch, model, CLEAN, CORR, group, receivers, metric)
    torch.testing.assert_close(fast.values, ref.values, atol=1e-5, rtol=1e-5)


def test_the_staircase_and_the_prefix_are_used(llama_tiny):
    """The batches really join at several blocks and start at the senders' position."""
    s = engine.setup(llama_tiny, CLEAN, CORR, LogitDiff(11, 12), keep={"clean": set()})
    from mechsink.patching.nodes import sender_group

    groups = [sender_group(x, 4) for x in ("L0H1@3", "MLP0@4", "L1H2@3", "L1H3@5")]
    (ids, joins, p), = _batches(llama_tiny, s.clean, groups, None, 16)
    assert joins == [0, 0, 1, 1] and p == 3 and ids == [0, 1, 2, 3]
    # an embedding sender's rows differ per copy: a direct-effect batch then starts at 0
    groups.append(sender_group("embed@3", 4))
    (_, joins, _), = _batches(llama_tiny, s.clean, groups, None, 16)
    assert set(joins) == {0}


def test_position_mean_through_a_receiver(llama_tiny, monkeypatch):
    """The P0 shape: every component's position-0 output, position_mean, into MLP1."""
    group = [f"{x}@0" for x in ("embed", "L0H0", "L0H3", "MLP0", "L0N5", "L1H1")]
    metric = MassiveValue(1, 0, 3)
    fast = path_patch(llama_tiny, CLEAN, None, group, ["MLP1"], metric,
                      ablation="position_mean")
    ref = slow(monkeypatch, llama_tiny, CLEAN, None, group, ["MLP1"], metric,
               ablation="position_mean")
    torch.testing.assert_close(fast.values, ref.values, atol=1e-5, rtol=1e-5)


def test_a_model_that_cannot_grow_falls_back(tmp_path, monkeypatch):
    """GPTBigCode's batch cannot grow mid-forward: one start per batch, same values."""
    import mechsink
    from tests.architectures import builder

    folder = builder.save("GPTBigCodeForCausalLM", tmp_path).folder
    model = mechsink.load_model(f"hf:{folder}", device="cpu")
    assert not capabilities(model).grows_at("hook_resid_pre")
    tokens = CLEAN % int(model.cfg.d_vocab)
    corr = CORR % int(model.cfg.d_vocab)
    group = ["L0H1", "MLP0", "L1H0", ["L0H0", "MLP1"]]
    fast = path_patch(model, tokens, corr, group, ["metric"], LogitDiff(1, 2), batch_size=8)
    ref = slow(monkeypatch, model, tokens, corr, group, ["metric"], LogitDiff(1, 2))
    torch.testing.assert_close(fast.values, ref.values, atol=1e-5, rtol=1e-5)
    s = engine.setup(model, tokens, corr, LogitDiff(1, 2), keep={"clean": set()})
    from mechsink.patching.nodes import sender_group

    groups = [sender_group(x, int(model.cfg.n_heads)) for x in ("L0H1", "L1H0")]
    (_, joins, _), = _batches(model, s.clean, groups, None, 8)
    assert joins == [0, 0]
