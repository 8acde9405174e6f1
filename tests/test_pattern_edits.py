"""An edit of the attention pattern that the model discards is refused in one line, not run.

XGLM's and JetMoE's TransformerLens bridges run transformers' own attention and fire
``hook_pattern`` on a pattern recomputed after the fact: what a hook returns there is dropped,
so ``attend_only_to_self`` and pattern patching silently did nothing. Here the fault is
simulated on a tiny Llama (its pattern and score hooks still fire, their return value is
thrown away), and :func:`mechsink.model.probes.edit_problem` must see it and the entry points
refuse it; the same model unfaulted passes.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from mechsink.errors import BadInputError

SUFFIXES = ("attn.hook_pattern", "attn.hook_attn_scores")


def _tiny() -> Any:
    from mechsink import load_model

    return load_model("random:llama-tiny", device="cpu", seed=0)  # its own probe cache


def _discard_edits(model: Any) -> None:
    """Every block's pattern and score hooks run their hooks and then return their input:
    the hooks fire, their edits are lost (the XGLM / JetMoE fault)."""
    for block in model.blocks:
        for suffix in SUFFIXES:
            point = block.get_submodule(suffix.split(".", 1)[0]).get_submodule(
                suffix.split(".", 1)[1])
            base = type(point)

            def call(self: Any, x: torch.Tensor, *a: Any, base: type = base, **kw: Any) -> Any:
                base.__call__(self, x, *a, **kw)
                return x

            point.__class__ = type(f"Discarding{base.__name__}", (base,), {"__call__": call})


@pytest.fixture(scope="module")
def faulty() -> Any:
    model = _tiny()
    _discard_edits(model)
    return model


def test_the_simulated_fault_drops_a_pattern_edit_silently(faulty):
    """The simulation is the fault: the hook fires, and its edit changes nothing."""
    tokens = torch.tensor([[1, 5, 9, 13, 2]])
    seen: list[int] = []

    def uniform(act: torch.Tensor, hook: Any) -> torch.Tensor:
        seen.append(1)
        return torch.full_like(act, 1.0 / act.shape[-1])

    with torch.no_grad():
        clean = faulty(tokens)
        edited = faulty.run_with_hooks(tokens, fwd_hooks=[("blocks.1.attn.hook_pattern",
                                                           uniform)])
    assert seen and torch.equal(clean, edited)


def test_the_probe_sees_discarded_edits_and_passes_a_working_model(faulty):
    from mechsink.model.probes import edit_problem

    for suffix in SUFFIXES:
        why = edit_problem(faulty, suffix)
        assert why is not None and suffix in why and "discarded" in why
    healthy = _tiny()
    assert all(edit_problem(healthy, s) is None for s in SUFFIXES)
    with pytest.raises(BadInputError, match="^edit_problem"):
        edit_problem(healthy, "attn.hook_z")


def _user_forwards(model: Any) -> tuple[list[int], list[Any]]:
    seen: list[int] = []

    def count(module: Any, args: tuple) -> None:
        if args and isinstance(args[0], torch.Tensor) and args[0].shape[1] != 3:
            seen.append(int(args[0].shape[1]))  # the probes run on 3 tokens

    return seen, [b.register_forward_pre_hook(count) for b in model.blocks]


def test_entry_points_refuse_a_discarded_pattern_edit_in_one_line(faulty):
    from mechsink.interventions import ablate, applied, attend_only_to_self
    from mechsink.patching import activation_patch

    tokens = torch.tensor([[1, 5, 9, 13, 2]])
    corrupted = torch.tensor([[1, 6, 10, 13, 2]])
    seen, handles = _user_forwards(faulty)
    try:
        calls = {
            "interventions": lambda: attend_only_to_self(faulty, [1], position=3),
            "patch": lambda: activation_patch(faulty, tokens, corrupted, "pattern_all_pos",
                                              lambda logits: logits[:, -1, 0].mean()),
        }
        for entry, call in calls.items():
            with pytest.raises(BadInputError) as err:
                call()
            line = str(err.value)
            assert "\n" not in line and line.startswith(
                f"LlamaForCausalLM is not supported by mechsink's {entry} for ")
            assert "hook_pattern" in line and "would work" in line
        with pytest.raises(BadInputError, match="hook_attn_scores"):  # a raw edit, by applied
            raw = replace(ablate(faulty, "blocks.1.attn.hook_z"),
                          hook="blocks.1.attn.hook_attn_scores")
            with applied(faulty, [raw]):
                pass
        assert seen == [], "a forward on the user's tokens ran before the refusal"
    finally:
        for handle in handles:
            handle.remove()
    with torch.no_grad(), applied(faulty, [ablate(faulty, "L1H0")]):  # other edits still run
        faulty(tokens)


def test_a_working_model_runs_the_same_edits():
    from mechsink.interventions import applied, attend_only_to_self

    healthy = _tiny()
    tokens = torch.tensor([[1, 5, 9, 13, 2]])
    with torch.no_grad():
        clean = healthy(tokens)
        with applied(healthy, attend_only_to_self(healthy, [1], position=3)):
            edited = healthy(tokens)
    assert (edited - clean).abs().max() > 1e-4
