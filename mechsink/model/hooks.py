"""Hook names in TransformerLens's vocabulary (:data:`KINDS`, the kinds of place mechsink names,
read through :mod:`mechsink.names`), and how a hook should edit what it sees."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from mechsink.errors import BadInputError


@dataclass(frozen=True)
class Kind:
    """One kind of place: TransformerLens's short ``name``, its ``hook`` (relative to the block,
    or the full name of a hook outside the blocks), the ``unit`` axis (``"head"``,
    ``"kv_head"``, ``"neuron"``, ``"channel"`` or None), the ``part`` of the block it sits in
    (``"attn"``, ``"mlp"``, ``"resid"`` or None outside the blocks) and ``pos_dim``, the axis
    of its activation (batch first) that holds (query) positions."""

    name: str
    hook: str
    unit: str | None
    part: str | None
    pos_dim: int = 1

    @property
    def in_block(self) -> bool:
        return self.part is not None


#: the one table of kinds (read as :data:`mechsink.names.KINDS`); every vocabulary of places in
#: mechsink is built on it
KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("resid_pre", "hook_resid_pre", "channel", "resid"),
    Kind("resid_mid", "hook_resid_mid", "channel", "resid"),
    Kind("resid_post", "hook_resid_post", "channel", "resid"),
    Kind("attn_out", "hook_attn_out", "channel", "attn"),
    Kind("mlp_out", "hook_mlp_out", "channel", "mlp"),
    Kind("q", "attn.hook_q", "head", "attn"),
    Kind("k", "attn.hook_k", "kv_head", "attn"),
    Kind("v", "attn.hook_v", "kv_head", "attn"),
    Kind("z", "attn.hook_z", "head", "attn"),
    Kind("rot_q", "attn.hook_rot_q", "head", "attn"),
    Kind("rot_k", "attn.hook_rot_k", "kv_head", "attn"),
    Kind("result", "attn.hook_result", "head", "attn"),
    Kind("pattern", "attn.hook_pattern", "head", "attn", pos_dim=2),
    Kind("attn_scores", "attn.hook_attn_scores", "head", "attn", pos_dim=2),
    # each head's own copy of the residual stream it reads (use_split_qkv_input) and the
    # MLP's input (use_hook_mlp_in): where edge discovery's receivers read
    Kind("q_input", "hook_q_input", "head", "attn"),
    Kind("k_input", "hook_k_input", "kv_head", "attn"),
    Kind("v_input", "hook_v_input", "kv_head", "attn"),
    Kind("mlp_in", "hook_mlp_in", "channel", "mlp"),
    Kind("pre", "mlp.hook_pre", "neuron", "mlp"),
    Kind("pre_linear", "mlp.hook_pre_linear", "neuron", "mlp"),
    Kind("post", "mlp.hook_post", "neuron", "mlp"),
    Kind("embed", "hook_embed", "channel", None),
    Kind("pos_embed", "hook_pos_embed", "channel", None),
    Kind("ln_final.hook_scale", "ln_final.hook_scale", None, None),
    Kind("ln_final.hook_normalized", "ln_final.hook_normalized", "channel", None),
)}


def tl_get_act_name() -> Callable[..., str]:
    """TransformerLens's own ``get_act_name`` (its shorthands: ``z``, ``k6``, ``mlp_post``),
    from whichever module this TransformerLens keeps it in."""
    try:  # TransformerLens 4 renamed ``utils`` to ``utilities`` (same names)
        from transformer_lens.utilities import get_act_name
    except ImportError:  # pragma: no cover - TransformerLens 2/3
        from transformer_lens.utils import get_act_name
    return get_act_name


def act_name(name: str, layer: int | None = None) -> str:
    """The full hook name of ``name`` at ``layer``, in TransformerLens's vocabulary.

    ``name`` is a short form TransformerLens's ``get_act_name`` knows (``"pattern"``, ``"z"``,
    ``"resid_pre"``, ``"mlp_out"``, ``"post"``, ...), a hook name relative to a block
    (``"attn.hook_z"``, ``"hook_mlp_out"``, ``"mlp.hook_post"``), or a full name, returned as is.
    """
    if name.startswith("blocks.") or (layer is None and name.startswith("hook_")):
        return name
    if "hook_" in name:  # relative to a block
        if layer is None:
            raise BadInputError(f"hook {name!r} lives in a block: give its layer.")
        return f"blocks.{layer}.{name}"
    return tl_get_act_name()(name, layer)


def hook_names(model: Any) -> set[str]:
    """Every hook name the model exposes (HookedTransformer vocabulary in compatibility mode)."""
    return set(model.hook_dict.keys())


def has_hook(model: Any, name: str) -> bool:
    """True when the model offers a hook point of this exact name."""
    return name in model.hook_dict


def write_in_place(act: Tensor, new: Tensor) -> Tensor:
    """Overwrite a hooked activation in place and return it (what a patching hook should do).

    On TransformerBridge some HookedTransformer names are aliases of a submodule's input: e.g.
    ``blocks.L.hook_resid_mid`` is ``blocks.L.ln2.hook_in``. Returning a new tensor from such a
    hook changes only that submodule's input (the MLP sees the patch, the residual skip does not);
    writing in place changes the shared residual tensor too, which is HookedTransformer's meaning
    of the name and what ``transformer_lens.patching`` (whose setters write in place) computes.
    The new tensor (not ``act``) is returned as well, because some bridge components (the
    norms' ``hook_scale``/``hook_normalized``) detect an edit by object identity only.
    """
    if not (act.requires_grad and act.is_leaf):
        act.copy_(new)
    return new


@contextmanager
def scale_edits_expected() -> Iterator[None]:
    """Silence TransformerLens's warning that a hook edited a norm's ``hook_scale`` (it then
    rebuilds the norm's output from the hooked values): freezing the scales is that edit."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="A forward hook edited hook_scale")
        yield

