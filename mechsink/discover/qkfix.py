"""AtP*'s QK fix for edges into a head's query or key (Kramar, Lieberum, Shah and Nanda 2024,
"AtP*: An efficient and scalable method for localizing LLM behaviour to components").

A sink head's softmax is saturated: its gradient is close to 0, so a first-order score of an
edge into its query or key says "no effect" even when the edge moves the attention a lot. The
fix recomputes the pattern exactly with the edge patched (the query or key input changed by the
sender's corrupted write, the softmax run for real) and keeps only the step after the pattern
linear: ``score = sum (A_patched - A_clean) * dm/dA``. One forward of the receiving attention
layer per sender (every head of the layer at once: head ``h``'s pattern reads only its own
query and its KV head's key). Edges straight into the metric, when the metric reads a
layer's attention pattern, are patched exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mechsink.discover.run import GraphRun, graph_mode
from mechsink.measure.wide import wide
from mechsink.model import act_name, run_from_layer
from mechsink.patching import plan


def qk_fixed(run: GraphRun, values: Tensor, grads: dict[str, Tensor]) -> Tensor:
    """``values`` with every edge into a query or key (and into a pattern metric) rescored."""
    g = run.graph
    out = values.clone()
    eidx = torch.full((len(g.senders), len(g.receivers)), -1, dtype=torch.long)
    eidx[g.src, g.dst] = torch.arange(g.n_edges)
    group = g.n_heads // g.n_kv
    for layer in range(g.n_layers):
        grad = grads.get(act_name("pattern", layer))
        if grad is None:
            continue
        cols = {k: [i for i, r in enumerate(g.receivers) if r.kind == k and r.layer == layer]
                for k in ("q", "k")}
        n_s = g.n_senders_before(g.receivers[cols["q"][0]])
        base = run.clean.acts[act_name("pattern", layer)]
        for kind in ("q", "k"):
            per_head = _pattern_scores(run, layer, kind, n_s, base, grad)  # [sender, head]
            if kind == "k":
                per_head = per_head.view(n_s, g.n_kv, group).sum(-1)
            for j, col in enumerate(cols[kind]):
                e = eidx[:n_s, col]
                out[e] = per_head[:, j]
    if g.point.kind == "attn":
        metric_edges = (g.dst == len(g.receivers) - 1).nonzero().flatten().tolist()
        out[metric_edges] = run.exact(metric_edges) - run.clean_value
    return out


def _pattern_scores(run: GraphRun, layer: int, kind: str, n_s: int, base: Tensor,
                    grad: Tensor) -> Tensor:
    """``sum (A_patched - A_clean) * dm/dA`` per sender and head, ``[sender, head]``
    (float64): layer ``layer``'s patterns with sender ``c``'s corrupted write added to every
    head's ``kind`` input, for each of the first ``n_s`` senders, in chunks of senders within
    the memory budget (each sender's patterns ``[batch, head, q, k]`` are reduced as soon as
    they are computed, never held for every sender at once)."""
    model, b = run.model, run.batch
    resid = run.clean.acts[act_name("resid_pre", layer)]
    # a chunk's copies: their forward's activations, and their patterns in float64 twice
    # (the difference and the product's operand)
    extra = 2 * base.numel() * 8
    per_copy = plan.bytes_per_copy(model, b, run.seq_len, 0, 0) + extra
    per = max(1, min(plan.copies_per_batch(model, b, run.seq_len, 0, 0,
                                           memory_budget=run.memory_budget),
                     run.memory_budget // per_copy))
    hook_in = act_name(f"hook_{kind}_input", layer)
    pattern = act_name("pattern", layer)
    grad64, base_w = grad.double(), wide(base)
    out = []
    with torch.no_grad(), graph_mode(model):
        for lo in range(0, n_s, per):
            senders = list(range(lo, min(n_s, lo + per)))
            add = run.edge_delta[:, :, senders].permute(2, 0, 1, 3).flatten(0, 1)  # [c*b, s, d]
            got: dict[str, Tensor] = {}

            def patch(act: Tensor, hook: Any, add: Tensor = add) -> Tensor:
                return act + add.unsqueeze(2).to(act.dtype)  # a post-norm's writes: float32

            def keep(act: Tensor, hook: Any, got: dict[str, Tensor] = got) -> None:
                got["p"] = act

            run_from_layer(model, resid.repeat(len(senders), 1, 1), layer,
                           fwd_hooks=[(hook_in, patch), (pattern, keep)], stop_after=[pattern])
            patterns = got.pop("p").view(len(senders), b, *base.shape[1:])
            out.append(torch.einsum("cbhij,bhij->ch", (wide(patterns) - base_w).double(),
                                    grad64))
    return torch.cat(out)
