"""Path patching, exact discovery edges and interventions on every architecture, against hand
references (:mod:`tests.architectures.reference`): path patching written with plain hooks,
edits written as forward hooks on the transformers model itself.

The sender is head 1 of block 0 (cheap: one head, the earliest block) and the receivers the
metric, head 0's query of block 1, and the first and last KV head's key and value of block 1
(every receiver kind discovery has in attention). Known failures are strict xfails in
:mod:`tests.architectures.expected`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.architectures import expected, reference
from tests.architectures.test_architectures import ARCHS, TOL, _corrupted, _logit_metric, rel

pytestmark = pytest.mark.slow

RECEIVERS = ("metric", "q", "k", "v")
SENDER = (0, 1)  # layer 0, head 1


def receiver_of(model: Any, kind: str) -> tuple[str, tuple[str, int, int] | None]:
    """mechsink's name of the receiver and the hand reference's (hook suffix, layer, unit)."""
    from mechsink.model import n_kv_heads

    if kind == "metric":
        return "metric", None
    if kind == "q":
        return "L1H0.q", ("attn.hook_q", 1, 0)
    kv = 0 if kind == "k" else n_kv_heads(model) - 1
    return f"L1KV{kv}.{kind}", (f"attn.hook_{kind}", 1, kv)


_HAND: dict[tuple[str, str], tuple[float, float]] = {}


def hand(m: Any, kind: str) -> tuple[float, float]:
    """The hand path-patching reference (patched, clean), once per (architecture, receiver)."""
    key = (m.arch, kind)
    if key not in _HAND:
        clean = m.tokens[:1]
        _HAND[key] = reference.path_patch_by_hand(
            m.bridge, clean, _corrupted(clean), _logit_metric, SENDER,
            receiver_of(m.bridge, kind)[1])
    return _HAND[key]


@pytest.mark.parametrize(("arch", "kind"), expected.cases("path", ARCHS, RECEIVERS))
def test_path_patching_equals_hand_reference(suite, arch, kind, record_property):
    """path_patch(L0H1 -> receiver) equals the two-step hand reference."""
    from mechsink.patching import path_patch

    m = suite.get(arch)
    clean = m.tokens[:1]
    got = path_patch(m.bridge, clean, _corrupted(clean), ["L0H1"],  # refusals first
                     [receiver_of(m.bridge, kind)[0]], _logit_metric, batch_size=1)
    want, _ = hand(m, kind)
    diff = rel(got.values[:1], torch.tensor([want]))
    record_property("diff", diff)
    assert diff <= TOL


_RUNS: dict[str, Any] = {}
_HAND_LATE: dict[tuple[str, str], tuple[float, float]] = {}


def _corrupted_late(tokens: torch.Tensor) -> torch.Tensor:
    """The suite's corruption plus position 8: on sliding-window models (Gemma 3's window of
    4) positions 1-2 cannot reach the last position in two blocks, and every edge would be 0
    there, an equality that tests nothing."""
    c = _corrupted(tokens)
    c[:, 8] = (c[:, 8] + 13) % 60
    return c


def hand_late(m: Any, kind: str) -> tuple[float, float]:
    """:func:`hand` with :func:`_corrupted_late`."""
    key = (m.arch, kind)
    if key not in _HAND_LATE:
        clean = m.tokens[:1]
        _HAND_LATE[key] = reference.path_patch_by_hand(
            m.bridge, clean, _corrupted_late(clean), _logit_metric, SENDER,
            receiver_of(m.bridge, kind)[1])
    return _HAND_LATE[key]


@pytest.mark.parametrize(("arch", "kind"), expected.cases("discovery", ARCHS, RECEIVERS))
def test_exact_edges_equal_path_patching(suite, arch, kind, record_property):
    """mechsink.discover's exact score of edge L0H1 -> receiver, plus the clean value, equals
    the hand path-patching reference of the same edge, and the edge does something (the
    reference moves the metric)."""
    from mechsink.discover import GraphRun, exact_scores

    m = suite.get(arch)
    clean = m.tokens[:1]
    if arch not in _RUNS:
        _RUNS[arch] = GraphRun(m.bridge, clean, _logit_metric,
                               corrupted=_corrupted_late(clean))
    run = _RUNS[arch]
    g = run.graph
    _, spec = receiver_of(m.bridge, kind)
    unit = None if spec is None else spec[2]
    edges = [e for e in range(g.n_edges)
             if (g.senders[int(g.src[e])].kind, g.senders[int(g.src[e])].layer,
                 g.senders[int(g.src[e])].index) == ("head", *SENDER)
             and g.receivers[int(g.dst[e])].kind == kind
             and (kind == "metric" or (g.receivers[int(g.dst[e])].layer,
                                       g.receivers[int(g.dst[e])].index) == (1, unit))]
    assert len(edges) == 1, [g.path_spec(e) for e in edges]
    got = float(exact_scores(run, edges=edges).values[edges[0]]) + run.clean_value
    want, want_clean = hand_late(m, kind)
    diff = max(rel(torch.tensor([got]), torch.tensor([want])),
               rel(torch.tensor([run.clean_value]), torch.tensor([want_clean])))
    record_property("diff", diff)
    record_property("effect", abs(want - want_clean))
    assert diff <= TOL
    assert abs(want - want_clean) > TOL / 10 * max(1.0, abs(want_clean)), "a vacuous edge"


def _refused(arch: str) -> bool:
    why = expected.reason(arch, "discovery:metric") or ""
    return why.startswith(f"BadInputError: {arch} is not supported by mechsink's discover: ")


@pytest.mark.parametrize("arch", [a for a in ARCHS if _refused(a)])
def test_discovery_refusal_is_one_line_before_any_forward(suite, arch):
    """Where the table expects discovery to be refused, GraphRun raises the one-line
    BadInputError it records (architecture, what is missing, what would make it work; the
    table keeps its first characters), before any forward beyond the cached probes."""
    from mechsink.discover import GraphRun
    from mechsink.errors import BadInputError
    from mechsink.model.support import refusal

    m = suite.get(arch)
    clean = m.tokens[:1]
    refusal(m.bridge, "discover")  # the probes run here, once
    forwards: list[int] = []
    handles = [b.register_forward_pre_hook(lambda *a: forwards.append(1))
               for b in m.bridge.blocks]
    try:
        with pytest.raises(BadInputError) as err:
            GraphRun(m.bridge, clean, _logit_metric, corrupted=_corrupted(clean))
    finally:
        for handle in handles:
            handle.remove()
    line = str(err.value)
    why = expected.reason(arch, "discovery:metric") or ""
    assert "\n" not in line and f"BadInputError: {line}".startswith(why)
    assert "would work" in line or "mechsink applies to" in line
    assert forwards == []


EDITS = ("ablate", "mask", "scale")


def _edited_logits(m: Any, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(mechsink's logits under the declared edit, the hand edit's logits)."""
    from mechsink.interventions import ablate, applied, attend_only_to_self, scale_tokens

    model, tokens = m.bridge, m.tokens
    n_layers = int(model.cfg.n_layers)
    if kind == "ablate":  # zero head 1 of block 0: its slice of the output projection's input
        edits = [ablate(model, "L0H1", mode="zero")]
        layer = reference.decoder_layers(m.hf, n_layers)[0]
        want = reference.hf_logits_with(m.hf, tokens, reference.attention_out_proj(layer),
                                        reference.zero_head_input(1, int(model.cfg.d_head)))
    elif kind == "scale":  # the residual entering block 1 at position 2, times 4
        edits = [scale_tokens(model, 1, [2], 4.0)]
        layer = reference.decoder_layers(m.hf, n_layers)[1]
        want = reference.hf_logits_with(m.hf, tokens, layer,
                                        reference.scale_block_input([2], 4.0), with_kwargs=True)
    else:  # query 3 of block 1 sees only itself: a mask edit on the pre-softmax scores
        edits = attend_only_to_self(model, [1], position=3)

        def mask(scores: torch.Tensor, hook: Any) -> torch.Tensor:
            out = scores.clone()
            out[:, :, 3, :] = float("-inf")
            out[:, :, 3, 3] = scores[:, :, 3, 3]
            return out

        with torch.no_grad():
            want = model.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_attn_scores",
                                                            mask)])
    with torch.no_grad(), applied(model, edits):
        got = model(tokens)
    return got, want


@pytest.mark.parametrize(("arch", "kind"), expected.cases("intervention", ARCHS, EDITS))
def test_interventions_equal_hand_edits(suite, arch, kind, record_property):
    """ablate (zero a head), attend_only_to_self (a mask edit) and scale_tokens equal the same
    edit made by hand; and each edit changes the logits (a no-op would pass otherwise)."""
    m = suite.get(arch)
    got, want = _edited_logits(m, kind)
    diff = rel(got, want)
    record_property("diff", diff)
    assert diff <= TOL
    assert rel(got, m.logits) > 1e-3, "the edit did not change the logits"
