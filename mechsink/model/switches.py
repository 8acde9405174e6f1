"""The hook switches TransformerLens's HookedTransformer and TransformerBridge share, set for
the length of a ``with`` block and restored on exit (also after an exception).

``use_split_qkv_input`` gives each head its own copy of its query/key/value input
(``hook_q_input`` ``[batch, pos, head, d_model]``), ``use_attn_result`` each head's write
(``hook_result``), ``use_hook_mlp_in`` the MLP's own copy of its input (``hook_mlp_in``). They
leave the model's outputs unchanged; what they cost is memory and time (the per-head input
forks are the expensive part).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from mechsink.errors import BadInputError

#: the switches, in the order they are set
SWITCHES = ("use_split_qkv_input", "use_attn_result", "use_hook_mlp_in")


@contextmanager
def hook_switches(model: Any, *, split_qkv_input: bool, attn_result: bool,
                  hook_mlp_in: bool) -> Iterator[None]:
    """The three switches set as given (through the model's public ``set_use_...`` methods),
    each restored on exit where it changed. A model without one raises what its setter raises
    (AttributeError, NotImplementedError or ValueError) before the block runs."""
    wanted = dict(zip(SWITCHES, (split_qkv_input, attn_result, hook_mlp_in), strict=True))
    before = {f: bool(getattr(model.cfg, f, False)) for f in SWITCHES}
    try:
        for flag, value in wanted.items():
            getattr(model, f"set_{flag}")(value)
        yield
    finally:
        for flag, value in before.items():
            setter = getattr(model, f"set_{flag}", None)
            if setter is not None and bool(getattr(model.cfg, flag, False)) != value:
                setter(value)


@contextmanager
def graph_mode(model: Any, *, inputs: bool = True) -> Iterator[None]:
    """Per-head q/k/v inputs, per-head results and ``hook_mlp_in`` on, restored on exit
    (``inputs=False``: per-head results only, what recording the senders' writes needs; the
    per-head input forks are the expensive part): the mode edge discovery runs its graph in.

    A model that cannot give each head its own input is refused in one line.
    """
    with ExitStack() as stack:
        try:
            stack.enter_context(hook_switches(model, split_qkv_input=inputs, attn_result=True,
                                              hook_mlp_in=inputs))
        except (AttributeError, NotImplementedError, ValueError) as exc:
            raise BadInputError(
                f"this model cannot give each head its own query/key/value input ({exc}); "
                "edge discovery needs TransformerLens's use_split_qkv_input."
            ) from exc
        yield


@contextmanager
def mlp_in_only(model: Any) -> Iterator[None]:
    """``hook_mlp_in`` on (the MLP's own copy of its input), every per-head switch off: the
    plain forward whose gradients are put together per head afterwards."""
    with hook_switches(model, split_qkv_input=False, attn_result=False, hook_mlp_in=True):
        yield

