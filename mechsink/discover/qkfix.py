"""AtP*'s QK fix for edges into a head's query or key (Kramar, Lieberum, Shah and Nanda 2024,
"AtP*: An efficient and scalable method for localizing LLM behaviour to components").

A sink head's softmax is saturated: its gradient is close to 0, so a first-order score of an
edge into its query or key says "no effect" even when the edge moves the attention a lot. The
fix recomputes the pattern exactly with the edge patched (the query or key input changed by the
sender's corrupted write, the softmax run for real) and keeps only the step after the pattern
linear: ``score = sum (A_patched - A_clean) * dm/dA``. One forward of the receiving attention
layer per sender (every head of the layer at once: head ``h``'s pattern reads only its own
query and its KV head's key), many senders stacked per run; none for query edges when only
position 0 is corrupted (query 0 attends to key 0 alone, so no pattern moves; not on a model
with a learned sink logit, whose row 0 reads its query). Edges straight into the metric, when
the metric reads a layer's attention pattern, are patched exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from mechsink.discover import plain_grads
from mechsink.discover.graph_run import GraphRun, graph_mode
from mechsink.measure.wide import wide
from mechsink.model import (
    act_name,
    attention_scale,
    block_norm,
    has_hook,
    has_learned_sink,
    run_from_layer,
)
from mechsink.patching import plan

#: patched tokens per one-layer run: a run of one attention layer is mostly fixed per-call cost
#: at the whole-model default, so it stacks more copies (within the memory budget)
TOKENS_PER_RUN = 4096


def qk_fixed(run: GraphRun, values: Tensor, grads: dict[str, Tensor]) -> Tensor:
    """``values`` with every edge into a query or key (and into a pattern metric) rescored."""
    g = run.graph
    out = values.clone()
    eidx = torch.full((len(g.senders), len(g.receivers)), -1, dtype=torch.long)
    eidx[g.src, g.dst] = torch.arange(g.n_edges)
    group = g.n_heads // g.n_kv
    first_only = run.positions.nonzero().flatten().tolist() == [0]  # corrupted at 0 alone
    key0 = _Key0(run) if first_only else None
    for layer in range(g.n_layers):
        grad = grads.get(act_name("pattern", layer))
        if grad is None:
            continue
        cols = {k: [i for i, r in enumerate(g.receivers) if r.kind == k and r.layer == layer]
                for k in ("q", "k")}
        n_s = g.n_senders_before(g.receivers[cols["q"][0]])
        base = run.clean.acts[act_name("pattern", layer)]
        for kind in ("q", "k"):
            if kind == "q" and first_only and not has_learned_sink(run.model, layer):
                # only query 0 moved, and it attends to key 0 alone (its row is 1 whatever
                # its query): no pattern changes, the edge's score is 0
                per_head = torch.zeros(n_s, g.n_heads, dtype=torch.float64)
            elif kind == "k" and key0 is not None and key0.holds(layer):
                per_head = key0.scores(layer, n_s, base, grad)  # [sender, head]
            else:
                per_head = _pattern_scores(run, layer, kind, n_s, base, grad)  # [sender, head]
            if kind == "k":
                per_head = per_head.view(n_s, g.n_kv, group).sum(-1)
            for j, col in enumerate(cols[kind]):
                e = eidx[:n_s, col]
                out[e] = per_head[:, j].to(out)  # the scores stay on the CPU
    if g.point.kind == "attn":
        metric_edges = (g.dst == len(g.receivers) - 1).nonzero().flatten().tolist()
        out[metric_edges] = run.exact(metric_edges) - run.clean_value
    return out


class _Key0:
    """Key edges when only position 0 is corrupted, without running the layer: only key 0
    moves, by ``dk = (ln1(R_0 + d_0) - ln1(R_0)) W_K`` (rotary leaves position 0 as it is), so
    each query's logit of key 0 moves by ``delta = q_i . dk / scale`` and its row becomes
    ``A'_i0 = A_i0 e^delta / D``, ``A'_ij = A_ij / D`` (``D = 1 + A_i0 (e^delta - 1)``).

    Used per layer only where the clean run shows every premise: q/k are ln1's projections
    (:attr:`GraphRun.head_projections`), the rotated key at position 0 is the unrotated one,
    ``hook_attn_scores`` is the rotated queries and keys' dot product over ``scale`` at every
    causal position, and the pattern is its causal softmax (a soft-cap, an ALiBi bias, a
    sliding window or a learned sink fails one of them: those layers run as before)."""

    def __init__(self, run: GraphRun) -> None:
        self.run = run
        weights = run.head_projections if plain_grads.ENABLED else None
        self.ok: dict[int, dict[str, Tensor]] = {}
        if weights is None:
            return
        model, n = run.model, run.graph.n_layers
        names = {"q": "q", "k": "k"}
        if has_hook(model, act_name("rot_q", 0)):
            names = {"q": "rot_q", "k": "rot_k"}
        wanted = {act_name(k, layer) for layer in range(n)
                  for k in {*names.values(), "k", "attn_scores", "pattern"}}
        with torch.no_grad():
            _, cache = model.run_with_cache(run.tokens, names_filter=lambda h: h in wanted,
                                            stop_at_layer=n)
        for layer in range(n):
            got = {k: cache[act_name(v, layer)] for k, v in names.items()}
            if self._premises(layer, got, cache[act_name("k", layer)],
                              cache[act_name("attn_scores", layer)],
                              cache[act_name("pattern", layer)]):
                self.ok[layer] = {"q": got["q"], "w": weights["k"][layer]}

    def _premises(self, layer: int, seen: dict[str, Tensor], k_raw: Tensor, scores: Tensor,
                  pattern: Tensor) -> bool:
        q, k = wide(seen["q"]), wide(seen["k"])  # [batch, pos, head / kv head, d_head]
        group = q.shape[2] // k.shape[2]
        if group * k.shape[2] != q.shape[2] or not torch.allclose(
                k[:, 0], wide(k_raw[:, 0]), rtol=1e-4, atol=1e-5):
            return False
        scale = attention_scale(self.run.model, layer)
        mine = torch.einsum("bihd,bjhd->bhij", q, k.repeat_interleave(group, 2)) / scale
        causal = torch.ones(mine.shape[-2:], dtype=torch.bool, device=mine.device).tril()
        theirs = wide(scores)
        if not torch.allclose(mine[..., causal], theirs[..., causal], rtol=1e-4, atol=1e-4):
            return False
        soft = theirs.masked_fill(~causal, float("-inf")).softmax(-1)
        return bool(torch.allclose(soft, wide(pattern), rtol=1e-4, atol=1e-5))

    def holds(self, layer: int) -> bool:
        return layer in self.ok

    def scores(self, layer: int, n_s: int, base: Tensor, grad: Tensor) -> Tensor:
        """``sum (A' - A) dm/dA`` per sender and query head, ``[sender, head]`` (float64)."""
        run, got = self.run, self.ok[layer]
        norm = block_norm(run.model, layer, "ln1")
        r0 = run.clean.acts[act_name("resid_pre", layer)][:, :1]  # [batch, 1, d_model]
        with torch.no_grad():
            d0 = run.edge_delta[:, :1, :n_s].permute(2, 0, 1, 3).flatten(0, 1)  # [s*b, 1, d]
            moved = norm(r0.repeat(n_s, 1, 1) + d0.to(r0.dtype)) - norm(r0).repeat(n_s, 1, 1)
            dk = torch.einsum("bd,hde->bhe", wide(moved[:, 0]), wide(got["w"]))
        q = got["q"].double()  # [batch, pos, head, d_head]
        b, _, heads, _ = q.shape
        dk = dk.double().view(n_s, b, dk.shape[1], -1).repeat_interleave(heads // dk.shape[1], 2)
        delta = torch.einsum("bihd,sbhd->sbhi", q, dk) / attention_scale(run.model, layer)
        a0 = wide(base[..., 0]).double()  # [batch, head, query]
        g = grad.double()
        rest = (wide(base).double() * g).sum(-1) - a0 * g[..., 0]  # sum_{j>0} A_ij g_ij
        grow = torch.exp(delta.clamp(-700.0, 700.0))
        inv = 1.0 / (1.0 + a0 * (grow - 1.0))  # 1 / D
        change = (a0 * grow * inv - a0) * g[..., 0] + (inv - 1.0) * rest
        return change.sum((1, 3))  # over batch and queries: [sender, head]


def _pattern_scores(run: GraphRun, layer: int, kind: str, n_s: int, base: Tensor,
                    grad: Tensor) -> Tensor:
    """``sum (A_patched - A_clean) * dm/dA`` per sender and head, ``[sender, head]``
    (float64), from :func:`_patched_patterns` in chunks of senders within the memory budget
    (each chunk's patterns reduced as soon as they are computed, never held for every sender
    at once)."""
    b = run.batch
    # a chunk's copies: their forward's activations, and their patterns in float64 twice
    # (the difference and the product's operand)
    per_copy = plan.bytes_per_copy(run.model, b, run.seq_len, 0, 0) + 2 * base.numel() * 8
    per = max(1, min(plan.copies_per_batch(run.model, b, run.seq_len, 0, 0,
                                           memory_budget=run.chunk_budget,
                                           tokens_per_batch=TOKENS_PER_RUN),
                     run.chunk_budget // per_copy))
    grad64, base_w = grad.double(), wide(base)
    out = []
    for lo in range(0, n_s, per):
        patterns = _patched_patterns(run, layer, kind, list(range(lo, min(n_s, lo + per))))
        out.append(torch.einsum("cbhij,bhij->ch", (wide(patterns) - base_w).double(), grad64))
    return torch.cat(out)


def _patched_patterns(run: GraphRun, layer: int, kind: str, senders: list[int]) -> Tensor:
    """Layer ``layer``'s patterns with sender ``c``'s corrupted write added to every head's
    ``kind`` input, for each of ``senders``: ``[sender, batch, head, q, k]`` (one run).

    Where every layer's ``attn.hook_q/k`` is its ``ln1`` output's projection
    (:attr:`GraphRun.head_projections`), the layer runs plainly with the projected change
    ``(ln1(R + d_c) - ln1(R)) W`` added at ``attn.hook_q`` / ``hook_k`` (before rotary), the
    exact edge patch's closed form; otherwise in graph mode, each head reading its own copy."""
    model, b = run.model, run.batch
    resid = run.clean.acts[act_name("resid_pre", layer)]
    weights = run.head_projections if plain_grads.ENABLED else None
    pattern = act_name("pattern", layer)
    copies = resid.repeat(len(senders), 1, 1)
    add = run.edge_delta[:, :, senders].permute(2, 0, 1, 3).flatten(0, 1)  # [c*b, s, d]
    if weights is None:
        hook_in, mode = act_name(f"hook_{kind}_input", layer), graph_mode(model)
        add = add.unsqueeze(2)  # every head's own copy of its input
    else:
        hook_in, mode = act_name(kind, layer), plain_grads.mlp_in_only(model)
    got: dict[str, Tensor] = {}

    def patch(act: Tensor, hook: Any) -> Tensor:
        return act + add.to(act.dtype)  # a post-norm's writes: float32

    def keep(act: Tensor, hook: Any) -> None:
        got["p"] = act

    with torch.no_grad(), mode:
        if weights is not None:  # the change of every head's query / key
            norm = block_norm(model, layer, "ln1")
            base = norm(resid).repeat(len(senders), 1, 1)
            moved = norm(copies + add.to(copies.dtype)) - base
            add = torch.einsum("bpd,hde->bphe", moved, weights[kind][layer])
        run_from_layer(model, copies, layer, fwd_hooks=[(hook_in, patch), (pattern, keep)],
                       stop_after=[pattern])
    return got["p"].view(len(senders), b, *got["p"].shape[1:])
