"""What an edge graph's run holds whatever its chunking, checked against the memory budget
before any forward.

A :class:`~mechsink.discover.graph_run.GraphRun` keeps, for every token, every sender's write
(``[batch, pos, sender, d_model]``): the clean writes, their corrupted-minus-clean ``delta``
(a second copy where a post-attention norm is recomputed), the clean run's per-head results
they are built from, and, while it is set up, the corrupted run's; a gradient method adds one
gradient per receiver input. None of these can be split into chunks without running the model
once per chunk, so a run that would not fit is refused in one line naming the size and what to
lower. (The rest, stacked copies and the QK fix's patterns, is chunked within what the budget
leaves beside them: on Llama-3-8B's shapes in bfloat16 the chunks took a budget of their own
on top of these tensors, and edge discovery held twice its budget.)
"""

from __future__ import annotations

from typing import Any

from mechsink.errors import BadInputError
from mechsink.model import n_kv_heads, true_dtype
from mechsink.model.memory import format_size


def held_bytes(model: Any, batch: int, seq_len: int, n_senders: int, *,
               post_norm: bool = False) -> tuple[int, int]:
    """``(total, one)``: the bytes a graph run holds that chunking cannot shrink, and the
    size of one ``[batch, pos, sender, d_model]`` tensor."""
    cfg = model.cfg
    elt = true_dtype(model).itemsize
    d_model, n_layers = int(cfg.d_model), int(cfg.n_layers)
    n_heads = int(cfg.n_heads)
    n_kv = n_kv_heads(model)
    one = batch * seq_len * n_senders * d_model * elt
    # clean writes, delta, the clean and the corrupted runs' per-head results (+ edge_delta)
    per_sender = 4 + (1 if post_norm else 0)
    receivers = n_layers * (n_heads + 2 * n_kv + 1)  # q, k, v per head; one MLP input
    grads = batch * seq_len * receivers * d_model * elt
    return per_sender * one + grads, one


def check_fits(model: Any, batch: int, seq_len: int, n_senders: int, budget: int, *,
               post_norm: bool = False) -> int:
    """Refuse, before any forward, a graph run whose unchunkable tensors exceed ``budget``;
    returns their bytes (:func:`held_bytes`)."""
    total, one = held_bytes(model, batch, seq_len, n_senders, post_norm=post_norm)
    if total <= budget:
        return total
    raise BadInputError(
        f"edge discovery on {batch} prompts x {seq_len} tokens would hold about "
        f"{format_size(total)} (each sender's write for every token: {n_senders} senders x "
        f"d_model {int(model.cfg.d_model)}, {format_size(one)} per copy, several copies, "
        f"and the receivers' gradients), over the memory budget of {format_size(budget)}: "
        "lower --n or --seq-len (memory grows with both), or raise --memory-budget "
        "(memory_budget=) if the machine has the room.")
