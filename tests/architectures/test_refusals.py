"""Every refusal the table expects is mechsink's one line, through the public entry point.

For each (architecture, check) whose reason in :mod:`tests.architectures.expected` is a
``BadInputError: <arch> is not supported by mechsink's ...`` line, the entry point the check
exercises (``census``, ``activation_patch``, ``run_from_layer``, ``path_patch``, ``ablate``,
``attend_only_to_self``, ``scale_tokens``) raises that BadInputError: one line, naming the
architecture, saying what would make it work (or that mechsink applies to transformers with
attention), the table holding its first characters; and no forward runs on the user's tokens
before it (the cached probes run on :func:`mechsink.model.probes.probe_tokens` only).
Discovery's refusals are checked by ``test_paths_and_edits``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.architectures import expected
from tests.architectures.test_architectures import _corrupted, _logit_metric

pytestmark = pytest.mark.slow


def entry_call(m: Any, check: str) -> Callable[[], Any]:
    """The public mechsink call the suite's ``check`` starts with, on the tiny model ``m``."""
    from mechsink.inputs.prompts import PromptSet
    from mechsink.interventions import ablate, attend_only_to_self, scale_tokens
    from mechsink.measure.census import census
    from mechsink.measure.keys import scored_qk_hooks
    from mechsink.model import run_from_layer
    from mechsink.patching import LogitDiff, activation_patch, path_patch

    model, clean = m.bridge, m.tokens[:1]
    family, _, kind = check.partition(":")
    if family == "census":
        return lambda: census(model, prompts=[PromptSet("custom", "given", m.tokens)],
                              batch_size=2, progress=lambda *a: None)
    if family == "activation":
        return lambda: activation_patch(model, clean, _corrupted(clean), kind, _logit_metric)
    if family == "logit_metric":
        return lambda: activation_patch(model, clean, _corrupted(clean), "resid_pre",
                                        LogitDiff(5, 7))
    if family == "start_at_layer":
        return lambda: run_from_layer(model, torch.zeros(1, clean.shape[1],
                                                         int(model.cfg.d_model)), 1)
    if family == "path":
        return lambda: path_patch(model, clean, _corrupted(clean), ["L0H1"], ["metric"],
                                  _logit_metric, batch_size=1)
    if family == "intervention":
        return {"ablate": lambda: ablate(model, "L0H1", mode="zero"),
                "mask": lambda: attend_only_to_self(model, [1], position=3),
                "scale": lambda: scale_tokens(model, 1, [2], 4.0)}[kind]
    if family == "discovery":
        from mechsink.discover import GraphRun

        return lambda: GraphRun(model, clean, _logit_metric, corrupted=_corrupted(clean))
    if family == "qkv_edit":
        return lambda: ablate(model, f"blocks.1.{scored_qk_hooks(model)[1]}", mode="scale",
                              scale=10.0, positions=[0])
    raise AssertionError(f"no entry point mapped for the check {check!r}")


def _cases() -> list:
    out = []
    for (arch, check), why in sorted(expected.refusals().items()):
        if check.startswith("discovery:") or check == "*":
            continue  # discovery: test_paths_and_edits; "*": the load test below
        if check.endswith(":*"):
            check = {"path:*": "path:metric", "intervention:*": "intervention:ablate",
                     "activation:*": "activation:resid_pre"}[check]
        out.append(pytest.param(arch, check, why, id=f"{check}-{arch}"))
    return out


def _one_line(line: str, arch: str, why: str) -> None:
    assert "\n" not in line and line.startswith(f"{arch} is not supported by ")
    assert f"BadInputError: {line}".startswith(why), line
    assert "would work" in line or "mechsink applies to" in line


@pytest.mark.parametrize(("arch", "why"), [
    pytest.param(arch, why, id=arch) for (arch, check), why in sorted(expected.refusals().items())
    if check == "*"])
def test_a_model_that_cannot_load_is_refused_in_one_line_by_load_model_and_wrap(suite, arch, why):
    """``hf:<folder>`` and ``mechsink.wrap`` of the transformers model raise the table's line
    (TransformerLens refusing compatibility mode, a bridge whose forward fails), not the
    traceback from inside TransformerLens."""
    import transformers

    import mechsink
    from mechsink.errors import BadInputError

    folder = suite.folder(arch)
    plain = transformers.AutoModelForCausalLM.from_pretrained(str(folder),
                                                              attn_implementation="eager")
    for load in (lambda: mechsink.load_model(f"hf:{folder}", device="cpu"),
                 lambda: mechsink.wrap(plain)):
        with pytest.raises(BadInputError) as err:
            load()
        _one_line(str(err.value), arch, why)


@pytest.mark.parametrize(("arch", "check", "why"), _cases())
def test_refusal_is_one_line_through_the_public_entry_point(suite, arch, check, why):
    from mechsink.errors import BadInputError

    m = suite.get(arch)
    user_forwards: list[int] = []

    def count(module: Any, args: tuple) -> None:
        hidden = next((a for a in args if isinstance(a, torch.Tensor)), None)
        if hidden is not None and hidden.dim() >= 2 and hidden.shape[1] != 3:
            user_forwards.append(int(hidden.shape[1]))  # probe_tokens are 3 long

    handles = [b.register_forward_pre_hook(count) for b in m.bridge.blocks]
    try:
        with pytest.raises(BadInputError) as err:
            entry_call(m, check)()
    finally:
        for handle in handles:
            handle.remove()
    _one_line(str(err.value), arch, why)
    assert user_forwards == [], "a forward on the user's tokens ran before the refusal"
