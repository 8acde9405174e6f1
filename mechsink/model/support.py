"""Whether an entry point can run exactly on a model, decided before any work.

:func:`check_supported` is the first line of every entry point (the census, activation, path
and attribution patching, edge discovery, the interventions readout, and the command line's
commands after the model loads). From the model's probed :func:`~mechsink.model.capabilities`
and its structure it either returns or raises one :class:`~mechsink.errors.BadInputError` of
ONE line: which architecture, what is missing, and what would make it work. A refused model
never half-runs (no forward beyond the probes, no folder written).

What each entry point needs (:data:`NEEDS`):

- every entry point: softmax attention in every block whose pattern is hooked
  (``attn.hook_pattern``): the sink is a property of it. Recurrent and state-space models
  (RWKV, Mamba) have none; hybrids (OLMo-hybrid's linear-attention layers) lack it in some
  layers; a bridge may not hook it (DeepSeek-V4's compressed attention);
- the patching engine (activation, path, attribution patching, discovery): the residual
  entering every block (``hook_resid_pre``), where runs from a later layer start;
- per-head outputs (path patching's and discovery's head senders, the census's head norms):
  ``attn.hook_z`` in every block and, for the census and discovery, the per-head output
  weights ``W_O`` (JetMoE's mixture of attention experts has neither);
- edge discovery: a residual stream that is the sum of the blocks' writes (post-LN blocks,
  the original GPT's, normalise the residual itself: refused), and per-head query/key/value
  inputs that hold that residual and whose edits reach the attention
  (:func:`~mechsink.model.probes.split_inputs_problem`).

- run_from_layer (the engine's forward from a later layer, public as
  :func:`mechsink.model.run_from_layer`): attention in every block and the hooked block input.

The hooks an entry point reads or edits are checked the same way: :func:`check_hooks_supported`
refuses a site whose hook the model never fires (JetMoE's ``attn.hook_z``), and
:func:`check_edits_reach` an edit of the pattern or the scores that the model discards
(:func:`~mechsink.model.probes.edit_problem`: XGLM's and JetMoE's bridges fire
``hook_pattern`` after their attention ran, so an edit there would silently do nothing).

A metric is checked the same way by :func:`check_metric_supported` (the patching engine calls
it with the hooks the metric declares): a hook the model never fires is a one-line refusal
naming the metric and the hook.

Shortcuts that a probe found inexact (a ``start_at_layer`` that ignores its residual, batch
growth mid-forward) are not refusals: the engine falls back to exact runs for them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from mechsink.errors import BadInputError
from mechsink.model.probes import (
    PATTERN_EDIT_HOOKS,
    Capabilities,
    capabilities,
    edit_problem,
    split_inputs_problem,
)
from mechsink.model.weights import head_output_weights

Need = Callable[[Any, Capabilities], "str | None"]  # None: met; else "missing; fix"

_CHECKED: weakref.WeakKeyDictionary[Any, dict[str, str | None]] = weakref.WeakKeyDictionary()


def architecture(model: Any) -> str:
    """The model's architecture name (the transformers class, e.g. ``LlamaForCausalLM``)."""
    inner = getattr(model, "original_model", None)
    if inner is not None:
        return type(inner).__name__
    return str(getattr(model.cfg, "original_architecture", None) or type(model).__name__)


def _attention(model: Any, caps: Capabilities) -> str | None:
    if caps.fires_everywhere("attn.hook_pattern"):
        return None
    blocks = list(getattr(model, "blocks", []))
    with_attn = [i for i, b in enumerate(blocks) if getattr(b, "attn", None) is not None]
    if not with_attn:
        return ("its blocks have no softmax attention (they mix tokens by recurrence or a "
                "state space), so there is no attention pattern and no sink to measure; "
                "mechsink applies to transformers with attention in every layer")
    if len(with_attn) < len(blocks):
        return (f"only layers {with_attn} of {len(blocks)} have softmax attention (the others "
                "mix tokens without an attention pattern); mechsink's measurements and patches "
                "assume attention in every layer: it would work once they skip the other "
                "layers (not implemented)")
    return ("its TransformerLens bridge does not hook the attention pattern "
            "(blocks.<l>.attn.hook_pattern never fires); it would work with a TransformerLens "
            "adapter for it that computes and hooks the pattern")


def _residual(model: Any, caps: Capabilities) -> str | None:
    if caps.fires_everywhere("hook_resid_pre"):
        return None
    return ("the residual stream entering each block (blocks.<l>.hook_resid_pre) is not hooked "
            "by its TransformerLens bridge, and the patching engine starts its runs there; it "
            "would work with an adapter that hooks the block input")


def _head_outputs(model: Any, caps: Capabilities) -> str | None:
    if caps.fires_everywhere("attn.hook_z"):
        return None
    return ("its attention has no per-head outputs (blocks.<l>.attn.hook_z never fires), "
            "which head senders need; it would work with an adapter that hooks each head's "
            "output before the output projection")


def _output_weights(model: Any, caps: Capabilities) -> str | None:
    if _output_weight_shapes(model) is not None:
        return None
    return ("it exposes no per-head attention output weights (attn.W_O in every layer), which "
            "head norms and head writes need; it would work with an adapter that maps its "
            "output projection to W_O [head, d_head, d_model]")


def _output_weight_shapes(model: Any) -> tuple[int, ...] | None:
    """The ``[layer, head, d_head, d_model]`` shape of the per-head output weights, read off
    each block's own ``attn.W_O`` (the stacked ``model.W_O`` is a copy: 1 GiB on Llama-3-8B's
    shapes in bfloat16, built only where the blocks do not say); None when there are none."""
    n_layers = int(model.cfg.n_layers)
    try:
        shapes = {tuple(block.attn.W_O.shape) for block in model.blocks}
        count = len(model.blocks)
    except (AttributeError, RuntimeError, TypeError):
        try:
            stacked = head_output_weights(model)
        except BadInputError:
            return None
        shapes, count = {tuple(stacked.shape[1:])}, int(stacked.shape[0])
    if count != n_layers or len(shapes) != 1 or len(next(iter(shapes))) != 3:
        return None
    return (n_layers, *next(iter(shapes)))


def _additive_residual(model: Any, caps: Capabilities) -> str | None:
    if caps.residual_additive:
        return None
    return (f"its residual stream is not the sum of its blocks' writes (a block's input plus "
            f"its attention and MLP outputs is {caps.residual_diff:.2g} of its size off the "
            "block's output: a norm applied to the residual itself, as in post-LN blocks), and "
            "edge discovery splits the residual into its senders' writes; path patching "
            "(mechsink.patching.path_patch) measures the same edges exactly, and discovery "
            "would work with exact edges that recompute every later norm per edge "
            "(not implemented)")


def _split_inputs(model: Any, caps: Capabilities) -> str | None:
    problem = split_inputs_problem(model)
    if problem is None:
        return None
    return (f"its bridge's per-head query/key/value inputs {problem}, and edge discovery gives "
            "each receiving head its own copy of the residual stream there; path patching "
            "(mechsink.patching.path_patch) measures edges without them, and discovery would "
            "work with a TransformerLens bridge whose attention forks its input per head "
            "(use_split_qkv_input)")


#: entry point -> what it needs, checked in this order (the first unmet need is the refusal)
NEEDS: dict[str, tuple[Need, ...]] = {
    "census": (_attention, _output_weights),
    "patch": (_attention, _residual),
    "attribution": (_attention, _residual),
    "path": (_attention, _residual, _head_outputs),
    "discover": (_attention, _residual, _head_outputs, _output_weights, _additive_residual,
                 _split_inputs),
    "interventions": (_attention,),
    "run_from_layer": (_attention, _residual),
}


def refusal(model: Any, entry: str) -> str | None:
    """Why ``entry`` cannot run exactly on ``model`` (one line), or None when it can; decided
    once per model and entry point."""
    if entry not in NEEDS:
        raise BadInputError(f"unknown entry point {entry!r}: one of {', '.join(NEEDS)}.")
    try:
        done = _CHECKED.setdefault(model, {})
    except TypeError:  # not weak-referenceable: decide again next time
        done = {}
    if entry not in done:
        caps = capabilities(model)
        missing = next((why for need in NEEDS[entry] if (why := need(model, caps))), None)
        done[entry] = None if missing is None else \
            f"{architecture(model)} is not supported by mechsink's {entry}: {missing}."
    return done[entry]


def check_supported(model: Any, entry: str) -> None:
    """Raise a one-line :class:`BadInputError` (architecture, what is missing, what would make
    it work) when ``entry`` (one of :data:`NEEDS`) cannot run exactly on ``model``; call it
    before any other work."""
    why = refusal(model, entry)
    if why is not None:
        raise BadInputError(why)


def _silent(model: Any, hooks: Any) -> list[str]:
    """The hooks of ``hooks`` (full names) that ``model`` never fires: probed, and confirmed by
    one probe forward (a flag set since, such as use_attn_result, may fire them)."""
    caps = capabilities(model)
    silent = sorted(h for h in hooks if not caps.fires_at(h))
    if silent:
        from mechsink.model.probes import probe_tokens

        declared = [h for h in silent if h in model.hook_dict]
        if declared:
            with torch.no_grad():
                _, cache = model.run_with_cache(probe_tokens(model), names_filter=declared)
            silent = [h for h in silent if h not in cache.keys()]
    return silent


def check_hooks_supported(model: Any, entry: str, what: str, hooks: Any) -> None:
    """Raise a one-line :class:`BadInputError` when ``entry`` would read or edit, for ``what``
    (a site, an edit), a hook of ``hooks`` (full names) that ``model`` never fires: the work
    would end in a KeyError or, for an edit, silently change nothing. A model the entry point
    refuses as a whole (:func:`refusal`: no attention in those blocks) gets that line; its
    hooks that do fire stay usable (an edit of a hybrid model's attention layer runs)."""
    silent = _silent(model, hooks)
    if silent:
        why = refusal(model, entry)
        if why is not None:
            raise BadInputError(why)
        if getattr(model.cfg, "parallel_attn_mlp", False) and any(
                h.endswith("hook_resid_mid") for h in silent):
            raise BadInputError(
                f"{architecture(model)} is not supported by mechsink's {entry} for {what}: its "
                "blocks run attention and MLP in parallel (the MLP reads the block's input), "
                "so there is no resid_mid; it would work on resid_pre, attn_out or mlp_out.")
        shown = ", ".join(silent[:3]) + (f" (+{len(silent) - 3} more)" if len(silent) > 3
                                          else "")
        raise BadInputError(
            f"{architecture(model)} is not supported by mechsink's {entry} for {what}: it "
            f"needs {shown}, which this model's TransformerLens bridge does not fire; it would "
            "work with an adapter that hooks it (sites whose hooks fire, such as resid_pre, "
            "attn_out and mlp_out, run).")


def check_edits_reach(model: Any, entry: str, what: str, hooks: Any) -> None:
    """Raise a one-line :class:`BadInputError` when ``entry`` would edit, for ``what``, a
    pattern or score hook (:data:`~mechsink.model.probes.PATTERN_EDIT_HOOKS`) among ``hooks``
    whose edits the model discards (:func:`~mechsink.model.probes.edit_problem`): the edit
    would silently do nothing."""
    suffixes = sorted({s for h in hooks for s in PATTERN_EDIT_HOOKS if str(h).endswith(s)})
    for suffix in suffixes:
        problem = edit_problem(model, suffix)
        if problem is not None:
            raise BadInputError(
                f"{architecture(model)} is not supported by mechsink's {entry} for {what}: its "
                f"bridge's attention layers {problem}; it would work with a TransformerLens "
                "adapter whose attention computes its output from the hooked pattern (edits "
                "of other sites, such as attn.hook_z or hook_resid_pre, do reach it).")


def check_metric_supported(model: Any, metric: str, hooks: Any) -> None:
    """Raise a one-line :class:`BadInputError` when the metric named ``metric`` reads a hook
    (of ``hooks``, full names such as ``blocks.1.hook_resid_post``) that ``model`` never fires
    (probed, :func:`~mechsink.model.capabilities`): a patched run would find nothing to read
    after all its work. :func:`check_supported` sees the entry point; this sees the metric, and
    the patching engine calls it with the metric's declared needs before any forward."""
    silent = _silent(model, hooks)
    if silent:
        raise BadInputError(
            f"{architecture(model)} is not supported by the metric {metric!r}: it reads "
            f"{', '.join(silent)}, which this model's TransformerLens bridge declares but never "
            "fires; it would work with an adapter that fires that hook (or with a metric on "
            "the logits, which are always the model's own).")
