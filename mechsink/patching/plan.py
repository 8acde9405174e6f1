"""The batching planner: how many patched copies go in one forward, and which together.

A patched forward's cost is the tokens it computes times the blocks it runs, plus a fixed cost
per block call; its memory is what each stacked copy holds (:func:`bytes_per_copy`). The
planner stacks as many copies as a token target and the memory budget allow
(:func:`copies_per_batch`) and, for a sweep whose patches start at different positions, picks
which positions share a forward by dynamic programming over that cost (:func:`chunks`).
The forwards themselves run in :func:`mechsink.patching.engine.run_patched`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mechsink.model import capabilities, n_kv_heads, true_d_mlp, true_dtype
from mechsink.model.memory import memory_budget as resolve_budget
from mechsink.patching.engine import SPEEDUPS, Setup
from mechsink.patching.metrics import ALL, Needs

#: patched tokens per forward the engine aims for (CPU matmuls are efficient from about here;
#: tuned on a 2-core CPU, see benchmarks/patching.py)
DEFAULT_TOKENS_PER_BATCH = 512

#: a batch may mix patches at different positions (it then starts at the earliest) while it
#: computes at most this many times the tokens the patches need by themselves
MAX_RECOMPUTE = 2.0

#: what one block call costs beyond its tokens (reading the block's weights, Python dispatch
#: through the bridge), in layer-tokens of a large batch: the batching weighs it against the
#: tokens that mixing positions recomputes. About 2-3 ms per SmolLM2 block on a 2-core CPU,
#: at 17,000 layer-tokens/s (benchmarks/patching.py)
BLOCK_CALL_COST = 48

Unit = tuple[int, ...]


def logit_positions(needs: Needs) -> int:
    """How many positions a patched forward unembeds per row (-1: every computed one)."""
    return -1 if needs.logits == ALL else len(needs.logits or ())


def bytes_per_copy(model: Any, batch: int, seq_len: int, first: int, logit_positions: int) -> int:
    """Peak activation bytes one stacked copy adds to a patched forward from ``first`` on.

    Counts the copy's residual, one block's transient activations (queries/keys/values,
    attention scores and pattern, MLP hidden), every layer's keys/values over the whole
    sequence (the prefix cache grows to it) and the logits unembedded (``logit_positions``
    per row; -1 = all suffix positions).
    """
    cfg = model.cfg
    elt = true_dtype(model).itemsize  # the bridge's cfg.dtype stays float32 in bfloat16
    n_heads, d_head, d_model = int(cfg.n_heads), int(cfg.d_head), int(cfg.d_model)
    d_mlp = int(true_d_mlp(model) or 4 * d_model)  # OPT/XGLM: cfg.d_mlp is not their ffn_dim
    n_layers, vocab = int(cfg.n_layers), int(cfg.d_vocab)
    suffix = seq_len - first
    per_token = 8 * d_model + 4 * n_heads * d_head + 2 * n_heads * seq_len + 3 * d_mlp
    kv = 2 * n_layers * n_kv_heads(model) * d_head * seq_len
    logits = vocab * (suffix if logit_positions < 0 else logit_positions)
    return batch * elt * (suffix * per_token + kv + logits)


def copies_per_batch(
    model: Any,
    batch: int,
    seq_len: int,
    first: int,
    logit_positions: int,
    *,
    memory_budget: int | None = None,
    tokens_per_batch: int = DEFAULT_TOKENS_PER_BATCH,
) -> int:
    """How many patches to stack in one forward: about ``tokens_per_batch`` patched tokens,
    never more than ``memory_budget`` bytes of activations (at least one patch; default: what
    the model's device has free, :func:`mechsink.model.memory.memory_budget`)."""
    budget = resolve_budget(model, memory_budget)
    suffix = max(1, seq_len - first)
    by_tokens = max(1, tokens_per_batch // (batch * suffix))
    by_memory = budget // max(1, bytes_per_copy(model, batch, seq_len, first, logit_positions))
    return max(1, min(by_tokens, by_memory))


def staircase(model: Any = None) -> bool:
    """Whether patches at different layers share a forward (needs start_at_patched_layer, and
    a model whose batch may grow mid-forward: probed once per model by
    :func:`mechsink.model.capabilities`; Bloom, GPTBigCode, OPT, XGLM and OpenAI-GPT cannot)."""
    if not (SPEEDUPS["staircase"] and SPEEDUPS["start_at_patched_layer"]):
        return False
    return model is None or capabilities(model).grows_at("hook_resid_pre")


def chunks(
    model: Any, first_position: Callable[[Unit], int], units: list[Unit], s: Setup,
    batch_size: int | None, memory_budget: int | None,
) -> list[tuple[int, list[Unit]]]:
    """Units (index tuples, layer first) in batches, latest positions first: ``(first
    position, units by layer)``; ``first_position(unit)`` is the earliest position it patches.

    Units are grouped by their first patched position; consecutive groups may share batches
    that start at the earliest of their positions (recomputing the later groups' earlier
    tokens, at most :data:`MAX_RECOMPUTE` times their own work). Which groups share is chosen
    by dynamic programming over a cost in layer-tokens: the tokens each batch computes plus
    :data:`BLOCK_CALL_COST` per block it runs, so late positions (a token or two each) are
    batched together rather than paying a forward each. Each batch holds at most
    ``batch_size`` units (or what the memory budget and token target allow). With the
    staircase a batch holds every layer (each unit joins at its own); without it, batches hold
    one layer each.
    """
    reuse = SPEEDUPS["prefix_reuse"] and s.clean.kv is not None  # the model records K/V
    memory_budget = resolve_budget(model, memory_budget)  # read once: the plan is one plan
    n_logits = logit_positions(s.needs)
    last = s.last_layer
    first = {u: first_position(u) if reuse else 0 for u in units}
    groups: dict[int, list[Unit]] = {}
    for u in units:
        groups.setdefault(u[0] if not staircase(model) else 0, []).append(u)

    def cap(p: int) -> int:
        if batch_size is not None:
            return batch_size
        return copies_per_batch(model, s.batch, s.seq_len, p, n_logits,
                                memory_budget=memory_budget)

    out: list[tuple[int, list[Unit]]] = []
    for group in groups.values():
        by_pos: dict[int, list[Unit]] = {}
        for u in group:
            by_pos.setdefault(first[u], []).append(u)
        positions = sorted(by_pos, reverse=True)
        counts = [[0] * (last + 1) for _ in positions]  # units per join layer
        for k, p in enumerate(positions):
            for u in by_pos[p]:
                counts[k][u[0]] += 1
        for k, i in segments(positions, counts, last, s.seq_len, s.batch, cap):
            ordered = sorted((u for q in positions[i:k] for u in by_pos[q]), key=lambda v: v[0])
            c = cap(positions[k - 1])
            out.extend((positions[k - 1], ordered[j:j + c]) for j in range(0, len(ordered), c))
    return out


def segments(positions: list[int], counts: list[list[int]], last: int, seq_len: int,
             batch: int, cap: Callable[[int], int]) -> list[tuple[int, int]]:
    """The cheapest split of ``positions`` (latest first) into runs ``positions[i:k]``, each
    computed from its earliest position ``positions[k-1]``: dynamic programming over the
    cost of :func:`chunks` (``counts[k][layer]``: units of position ``k`` joining there).
    Returned as ``(k, i)`` pairs, latest run first."""
    depth = [last + 1 - layer for layer in range(last + 1)]  # blocks a unit runs
    own = [sum(n * d for n, d in zip(row, depth, strict=True)) * (seq_len - p)
           for row, p in zip(counts, positions, strict=True)]
    best, split = [0.0], [0]
    for k in range(1, len(positions) + 1):
        p = positions[k - 1]
        hist = [0] * (last + 1)
        weight = needed = 0.0
        best.append(float("inf"))
        split.append(k - 1)
        for i in range(k - 1, -1, -1):  # the run positions[i:k]
            hist = [a + b for a, b in zip(hist, counts[i], strict=True)]
            weight += sum(n * d for n, d in zip(counts[i], depth, strict=True))
            needed += own[i]
            if i < k - 1 and weight * (seq_len - p) > MAX_RECOMPUTE * max(needed, 1):
                break
            cost = best[i] + weight * batch * (seq_len - p) + BLOCK_CALL_COST * _blocks(
                hist, depth, cap(p))
            if cost < best[k]:
                best[k], split[k] = cost, i
    runs, k = [], len(positions)
    while k > 0:
        runs.append((k, split[k]))
        k = split[k]
    return runs[::-1]


def _blocks(hist: Sequence[int], depth: Sequence[int], cap: int) -> int:
    """Block calls of the units ``hist`` (per join layer) in batches of ``cap``, layer order:
    each batch runs from its first unit's join layer."""
    total, seen, boundary = 0, 0, 0
    for layer, n in enumerate(hist):
        seen += n
        while boundary < seen:  # a batch starts at unit ``boundary``, which joins here
            total += depth[layer]
            boundary += cap
    return total
