"""Run the model and read measurements off its cache: the one forward every readout uses.

A :class:`Measurement` names the per-block hooks it reads, what it computes from one chunk of
sequences (a :class:`Forward`: the chunk's tokens, its cache and, when asked, its logits) and
how the chunks' values combine. :func:`measure_forward` runs the tokens in chunks, caching only
the hooks the measurements need, and returns every measurement merged over the chunks. The
census, the timeline and the readouts under interventions
(:mod:`mechsink.interventions.readout`, which installs the edits around this) are built on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.cache import CacheLike, StackedCache, hook_names
from mechsink.measure.checks import check_batch_size
from mechsink.model import cache_blocks, true_dtype
from mechsink.model.memory import memory_budget as memory_budget_of

ChunkDone = Callable[[int, int], None]  # (sequences done, sequences in all)


@dataclass(frozen=True)
class Forward:
    """One chunk's forward: its tokens, where the chunk starts in the batch, the cached hooks
    and the logits (None unless a measurement asked for them)."""

    tokens: Int[Tensor, "batch pos"]
    start: int
    cache: CacheLike
    logits: Float[Tensor, "batch pos vocab"] | None


def merge_chunks(parts: Sequence[Any]) -> Any:
    """The default merge: tensors are concatenated along the batch; a result with a ``merge``
    classmethod (every :mod:`mechsink.measure` result) merges itself."""
    first = parts[0]
    if isinstance(first, Tensor):
        return torch.cat(list(parts))
    merge = getattr(type(first), "merge", None)
    if merge is None:
        raise TypeError(f"a {type(first).__name__} has no merge: give the Measurement one.")
    return merge(list(parts))


def first_chunk(parts: Sequence[Any]) -> Any:
    """A merge that keeps the first chunk's value (e.g. an example read from sequence 0)."""
    return parts[0]


@dataclass(frozen=True)
class Measurement:
    """What to read off a forward: the per-block hook suffixes it needs (cached at every layer),
    its value on one chunk, how chunk values merge, and whether it needs the logits."""

    hooks: tuple[str, ...]
    read: Callable[[Forward], Any]
    merge: Callable[[Sequence[Any]], Any] = merge_chunks
    logits: bool = False


def of_cache(hooks: Sequence[str], fn: Callable[[CacheLike], Any],
             merge: Callable[[Sequence[Any]], Any] = merge_chunks) -> Measurement:
    """A measurement that is a function of the cache alone (the pure functions of this package)."""
    return Measurement(tuple(hooks), lambda forward: fn(forward.cache), merge)


def bytes_per_sequence(model: Any, names: Sequence[str], seq_len: int, logits: bool) -> int:
    """About what one sequence adds to a chunk: its cached hooks (twice: as recorded and
    stacked over layers), its logits and one block's transient activations."""
    cfg = model.cfg
    d_model, n_heads = int(cfg.d_model), int(cfg.n_heads)
    d_head, d_mlp = int(cfg.d_head), int(getattr(cfg, "d_mlp", None) or 4 * d_model)
    per_token = 0
    for name in names:
        last = name.rsplit(".", 1)[-1]
        if last in ("hook_pattern", "hook_attn_scores"):
            per_token += n_heads * seq_len
        elif last in ("hook_q", "hook_k", "hook_v", "hook_z"):
            per_token += n_heads * d_head
        elif last == "hook_result":
            per_token += n_heads * d_model
        elif name.endswith(("mlp.hook_pre", "mlp.hook_post")):
            per_token += d_mlp
        else:
            per_token += d_model
    transient = 8 * d_model + 3 * d_mlp + 2 * n_heads * seq_len
    vocab = int(cfg.d_vocab) if logits else 0
    return max(1, true_dtype(model).itemsize * seq_len * (2 * per_token + transient + vocab))


@torch.no_grad()
def measure_forward(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    measurements: Mapping[str, Measurement],
    *,
    batch_size: int | None = None,
    on_chunk: ChunkDone | None = None,
    memory_budget: Any = None,
) -> dict[str, Any]:
    """Run ``tokens`` through ``model`` in chunks of ``batch_size`` sequences (None: one
    forward), caching only the hooks ``measurements`` read, and return each measurement merged
    over the chunks (keyed as given). A chunk is made smaller where its cache would exceed
    ``memory_budget`` bytes (default: a share of the device's free memory,
    :func:`mechsink.model.memory.memory_budget`). Hooks installed on the model
    (interventions) stay in place for every chunk; ``on_chunk(done, total)`` is called after
    each."""
    check_batch_size(batch_size)
    if not measurements:
        raise BadInputError("measure_forward needs at least one measurement.")
    suffixes = sorted({s for m in measurements.values() for s in m.hooks})
    n_layers = int(model.cfg.n_layers)
    names = hook_names(n_layers, suffixes)
    want_logits = any(m.logits for m in measurements.values())
    n = int(tokens.shape[0])
    if tokens.ndim != 2 or n == 0:
        raise BadInputError(f"tokens must be [batch, pos] with at least one sequence, got shape "
                            f"{tuple(tokens.shape)}.")
    per_seq = bytes_per_sequence(model, names, int(tokens.shape[1]), want_logits)
    by_memory = max(1, memory_budget_of(model, memory_budget) // per_seq)
    step = min(n if batch_size is None else batch_size, by_memory)
    parts: dict[str, list[Any]] = {key: [] for key in measurements}
    for start in range(0, n, step):
        chunk = tokens[start:start + step]
        if want_logits:
            logits, raw = model.run_with_cache(chunk, names_filter=names, return_type="logits")
            tensors = {name: raw[name] for name in list(raw.keys())}
            del raw
        else:  # the blocks only: no final norm, no unembedding
            logits, tensors = None, cache_blocks(model, chunk, names)
        # each hook held once, stacked over layers: the measurements read stacked() layers,
        # which would otherwise copy the cache once per measurement
        cache = StackedCache.of(tensors, suffixes, n_layers)
        del tensors
        forward = Forward(chunk, start, cache, logits if want_logits else None)
        for key, m in measurements.items():
            parts[key].append(m.read(forward))
        del forward, cache, logits
        if on_chunk is not None:
            on_chunk(min(start + step, n), n)
    return {key: measurements[key].merge(values) for key, values in parts.items()}
