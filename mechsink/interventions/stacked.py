"""One readout under many edit lists as one batched run: the prompts stacked once per edit list
(a dose, a condition), every edit applied to its own copy's rows only.

A dose-response reads the same prompts under a grid of edits; run one at a time, each dose is a
small forward of ``n`` sequences. :func:`read_each` runs ``len(edit_lists)`` copies of the
prompts through larger forwards instead: at every hook some edit list touches, one dispatching
hook hands each copy's rows to that copy's edits (in their order) and puts the rows back
together, so each copy sees exactly what it would have seen alone. Edits that read only their
own sequence (every edit of the causal chain: scaling, setting, masks, deviation from a fixed
centre, surgery toward a sequence's own median) give the same numbers as the loop, to float
tolerance; an edit that reads other sequences of its batch (``batch_mean``, ``resample``) would
see the other copies, so such lists run one at a time (:data:`BATCH_READERS`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from mechsink.interventions.edits import Intervention, applied
from mechsink.measure.forward import Measurement, measure_forward
from mechsink.model.precision import guard_overflow
from mechsink.model.support import check_supported

SPEEDUPS = {"stacked": True}  # False: one forward per edit list (the reference path)
# stacked rows (copies x prompts) per forward, at least batch_size: on a 2-core CPU a
# forward of 64 rows x 64 tokens ran fewer tokens per second than one of 16 rows
# (benchmarks/experiments.py --rows)
ROWS_PER_FORWARD = 16
BATCH_READERS = ("batch_mean", "resample")  # edits that read other sequences of the batch


def _reads_batch(edits: Sequence[Intervention]) -> bool:
    return any(word in e.description for e in edits for word in BATCH_READERS)


def _take(value: Any, lo: int, hi: int, total: int) -> Any:
    """Rows ``lo:hi`` of a merged measurement: a tensor, or a dataclass whose batch-first
    tensors are sliced (e.g. :class:`~mechsink.measure.sinks.SinkScores`)."""
    if isinstance(value, Tensor):
        return value[lo:hi]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        rows = {f.name: getattr(value, f.name)[lo:hi] for f in dataclasses.fields(value)
                if isinstance(getattr(value, f.name), Tensor)
                and getattr(value, f.name).dim() > 0 and getattr(value, f.name).shape[0] == total}
        if rows:
            return dataclasses.replace(value, **rows)
    raise TypeError(f"a {type(value).__name__} has no rows to split into copies: read it with "
                    "one forward per edit list.")


def _dispatch(name: str, groups: list[list[Intervention]], n: int, state: dict[str, int]
              ) -> Intervention:
    """The one hook at ``name`` for the stacked copies: each copy's rows through its edits.
    ``state['lo']`` is the stacked row the current chunk starts at."""
    fns = [[e.fn for e in g if e.hook == name] for g in groups]

    def fn(act: Tensor, hook: Any) -> Tensor | None:
        lo, hi = state["lo"], state["lo"] + int(act.shape[0])
        pieces, edited = [], False
        for j, mine in enumerate(fns):
            a, b = max(lo, j * n), min(hi, (j + 1) * n)
            if a >= b:
                continue
            x = act[a - lo:b - lo]
            for f in mine:
                out = f(x, hook)
                x = x if out is None else out
                edited = True
            pieces.append(x)
        return torch.cat(pieces) if edited else None

    positions = [e.max_position for g in groups for e in g
                 if e.hook == name and e.max_position is not None]
    return Intervention(name, fn, f"{len(groups)} stacked copies' edits of {name}",
                        max(positions) if positions else None)


def _stacked_run(model: Any, tokens: Tensor, measurements: Mapping[str, Measurement],
                 groups: list[list[Intervention]], rows: int) -> list[dict[str, Any]]:
    n = int(tokens.shape[0])
    state = {"lo": 0}
    hooks = list(dict.fromkeys(e.hook for g in groups for e in g))
    edits = [_dispatch(h, groups, n, state) for h in hooks]

    def advance(done: int, total: int) -> None:
        state["lo"] = done

    stacked = tokens.repeat(len(groups), 1)
    with applied(model, edits), guard_overflow(model):
        got = measure_forward(model, stacked, measurements, batch_size=rows, on_chunk=advance)
    total = n * len(groups)
    return [{key: _take(v, j * n, (j + 1) * n, total) for key, v in got.items()}
            for j in range(len(groups))]


def read_with_edits(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    measurements: Mapping[str, Measurement],
    edits: Sequence[Intervention] = (),
    *,
    batch_size: int | None = None,
    memory_budget: Any = None,
) -> dict[str, Any]:
    """:func:`~mechsink.measure.forward.measure_forward` with ``edits`` installed for every
    chunk (removed afterwards, also when a chunk raises); chunks stay within ``memory_budget``
    (default: a share of the device's free memory)."""
    check_supported(model, "interventions")
    with applied(model, list(edits)), guard_overflow(model):
        return measure_forward(model, tokens, measurements, batch_size=batch_size,
                               memory_budget=memory_budget)


def read_each(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    measurements: Mapping[str, Measurement],
    edit_lists: Sequence[Sequence[Intervention]],
    *,
    batch_size: int | None = None,
    rows_per_forward: int | None = None,
) -> list[dict[str, Any]]:
    """``[read_with_edits(model, tokens, measurements, e, batch_size=batch_size) for e in
    edit_lists]`` as batched forwards over stacked copies of ``tokens`` (``rows_per_forward``
    rows each, default the larger of ``batch_size`` and :data:`ROWS_PER_FORWARD`, smaller
    where the memory budget says so). Lists with an edit that reads other sequences of its
    batch, and every list when :data:`SPEEDUPS` is off, run one at a time."""
    lists = [list(e) for e in edit_lists]
    n = int(tokens.shape[0])
    rows = rows_per_forward or max(batch_size or n, ROWS_PER_FORWARD)
    alone = [i for i, e in enumerate(lists) if not SPEEDUPS["stacked"] or _reads_batch(e)]
    out: list[dict[str, Any] | None] = [None] * len(lists)
    for i in alone:
        out[i] = read_with_edits(model, tokens, measurements, lists[i], batch_size=batch_size)
    together = [i for i in range(len(lists)) if i not in alone]
    if together:
        check_supported(model, "interventions")
        per = max(1, rows // n)  # copies per forward (a copy larger than a forward is split)
        for s in range(0, len(together), per):
            idx = together[s:s + per]
            got = _stacked_run(model, tokens, measurements, [lists[i] for i in idx],
                               per * n if per > 1 else (batch_size or n))
            for i, g in zip(idx, got, strict=True):
                out[i] = g
    return [o for o in out if o is not None]
