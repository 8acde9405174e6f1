"""The patching engine shared by activation, path and attribution patching and edge discovery.

One :class:`Setup` per call: the tokens (checked), the bound metrics and what they read
(:class:`~mechsink.patching.metrics.Needs`), and one recorded run of each input (logits, the
activations asked for, every layer's keys and values). :func:`run_patched` is the one loop
every patching method runs: stacked copies of a residual from a layer with the caller's hooks,
what the metrics read captured, every metric read per copy (with gradients on request, for
attribution patching and edge attribution). How many copies go in one forward is planned by
:mod:`mechsink.patching.plan`.

Why it is fast: a patched run equals its source run upstream of the patch, so

- each patched forward starts at the patched layer from the cached residual;
- *prefix reuse*: a patch whose earliest patched position is ``p`` recomputes only positions
  ``p..``; attention reads the keys and values of positions ``< p`` from the recorded run
  (causal masking leaves them unchanged), and activations the metric reads at positions
  ``< p`` are the recorded ones;
- many patches are stacked in the batch of one forward, as many as the memory budget allows
  (:func:`mechsink.patching.plan.copies_per_batch`);
- *staircase*: patches at different layers share one forward; each copy joins the batch at
  the block it patches (its residual there is the recorded one), so no copy recomputes the
  blocks upstream of its patch and the batch stays large;
- the forward stops after the last hook the metrics read, and only the positions a logit
  metric reads are unembedded.

:data:`SPEEDUPS` switches each idea off for benchmarks/patching.py (results are identical).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model import (
    PrefixKV,
    act_name,
    capabilities,
    check_metric_supported,
    check_seq_len,
    check_tokens,
    hook_names,
    run_from_layer,
    run_with_kv,
    to_tokens,
    true_dtype,
    unembed,
)
from mechsink.names import kind_of_hook
from mechsink.patching.metrics import ALL, Metric, Needs, Outputs, as_metric, check_value, layer_of

TokensLike = str | Sequence[str] | Tensor
HookFn = Callable[..., Any]

#: the speed ideas, switchable so benchmarks/patching.py can measure what each one buys
SPEEDUPS = {"start_at_patched_layer": True, "early_stop": True, "prefix_reuse": True,
            "staircase": True}


def as_tokens(model: Any, x: TokensLike, *, prepend_bos: bool = True) -> Int[Tensor, "batch pos"]:
    """Token ids from text (BOS prepended when ``prepend_bos``) or a checked token tensor."""
    if isinstance(x, Tensor):
        if x.ndim not in (1, 2):
            raise BadInputError(f"tokens must be a tensor [batch, pos], got {x.ndim} dims.")
        check_tokens(model, x)
        t = x if x.ndim == 2 else x.unsqueeze(0)
        check_seq_len(model, t.shape[1])
        return t.to(getattr(model.cfg, "device", None) or "cpu")
    return to_tokens(model, x, prepend_bos=prepend_bos)


def check_pair(clean: Tensor, corrupted: Tensor) -> None:
    """Clean and corrupted must have the same shape (same batch, same number of tokens)."""
    if clean.shape != corrupted.shape:
        raise BadInputError(
            f"clean {tuple(clean.shape)} and corrupted {tuple(corrupted.shape)} token shapes "
            "differ: patching needs prompts of the same length (pad or pick prompts that "
            "tokenise to the same number of tokens)."
        )


def check_batch_size(batch_size: int | None) -> None:
    """None (the engine picks) or a positive integer."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
            batch_size, int) or batch_size < 1):
        raise BadInputError(
            f"batch_size must be a positive integer or None (the engine picks), got "
            f"{batch_size!r}."
        )


def resolve_needs(model: Any, metric: Metric, seq_len: int) -> Needs:
    """The metric's needs with logit positions made non-negative and hook names checked: a
    hook the model never fires is a one-line refusal naming the metric, and logits at a few
    positions become the full logits where mechsink's unembedding is not the model's own
    (:attr:`~mechsink.model.probes.Capabilities.unembed_exact`)."""
    needs = metric.needs(model)
    known = hook_names(model)
    unknown = sorted(h for h in needs.hooks if h not in known)
    if unknown:
        raise BadInputError(f"the metric reads hooks this model does not have: {unknown}.")
    check_metric_supported(model, metric.name, needs.hooks)
    if isinstance(needs.logits, tuple) and not capabilities(model).unembed_exact:
        # mechsink's own unembedding of a few positions is not this model's logits (a readout
        # step it does not know, or no last-block output hook): read the model's own logits
        needs = Needs(needs.hooks, ALL)
    if isinstance(needs.logits, tuple):
        pos = []
        for p in needs.logits:
            q = p + seq_len if p < 0 else p
            if not 0 <= q < seq_len:
                raise BadInputError(f"the metric reads position {p}, outside 0..{seq_len - 1}.")
            pos.append(q)
        needs = Needs(needs.hooks, tuple(sorted(set(pos))))
    return needs


def last_layer_read(model: Any, needs: Needs) -> int:
    """The last block a patched forward must run for metrics with ``needs``: the last layer
    they read a hook of, or the last block when they read logits."""
    n_layers = int(model.cfg.n_layers)
    if needs.logits is not None:
        return n_layers - 1
    layers = [layer_of(h) for h in needs.hooks]
    return max([x for x in layers if x is not None], default=n_layers - 1)


def final_resid(model: Any) -> str:
    """The hook of the last block's output (what the final norm and unembedding read)."""
    return act_name("resid_post", int(model.cfg.n_layers) - 1)


@dataclass
class Run:
    """One recorded forward of an input: logits, the activations asked for, keys/values."""

    tokens: Int[Tensor, "batch pos"]
    logits: Tensor | None  # None: recorded up to a block before the last (see record)
    acts: dict[str, Tensor]
    kv: PrefixKV | None

    @property
    def batch(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])


def record(model: Any, tokens: Tensor, names: Iterable[str],
           last_layer: int | None = None) -> Run:
    """Run ``tokens`` once, keeping ``names`` and every layer's keys/values (with
    ``last_layer``: up to that block only, for patched runs that stop there too)."""
    logits, acts, kv = run_with_kv(model, tokens, set(names), last_layer)
    return Run(tokens, logits, acts, kv)


def record_pair(model: Any, first: Tensor, second: Tensor, first_names: Iterable[str],
                second_names: Iterable[str], last_layer: int | None = None) -> tuple[Run, Run]:
    """:func:`record` of two inputs of one shape in one forward (stacked along the batch): a
    short prompt's forward costs about what its weights take to read, so two cost about one."""
    a, b = set(first_names), set(second_names)
    logits, acts, kv = run_with_kv(model, torch.cat([first, second]), a | b, last_layer)
    n = int(first.shape[0])

    def part(rows: slice, names: set[str], other: set[str]) -> Run:
        # a slice of a name only this run keeps is copied (it would hold both runs' storage)
        kept = {k: acts[k][rows] if k in other else acts[k][rows].clone() for k in names}
        return Run(first if rows.start == 0 else second,
                   None if logits is None else logits[rows], kept,
                   None if kv is None else kv.rows(rows))

    return part(slice(0, n), a, b), part(slice(n, None), b, a)


def outputs_of(model: Any, run: Run, needs: Needs) -> Outputs:
    """What a metric with ``needs`` sees on the unpatched ``run``."""
    positions = needs.logits if isinstance(needs.logits, tuple) else None
    logits: Tensor | None = None
    if positions is not None:
        logits = unembed(model, run.acts[final_resid(model)][:, list(positions)])
    elif needs.logits == ALL:
        logits = run.logits
    return Outputs(run.seq_len, {h: run.acts[h] for h in needs.hooks}, logits, positions)


def names_for(model: Any, needs: Needs) -> set[str]:
    """The activations a run must keep so a metric with ``needs`` can be read from it."""
    names = set(needs.hooks)
    if isinstance(needs.logits, tuple):
        names.add(final_resid(model))
    return names


@dataclass
class Setup:
    """What every patching call builds once: tokens, bound metrics, their needs and last
    layer, baselines."""

    model: Any
    clean: Run
    corrupted: Run | None
    metrics: tuple[Metric, ...]
    needs: Needs
    clean_values: tuple[Tensor, ...]
    corrupted_values: tuple[Tensor | None, ...]
    last_layer: int  # the last block a patched forward runs (:func:`last_layer_read`)

    @property
    def batch(self) -> int:
        return self.clean.batch

    @property
    def seq_len(self) -> int:
        return self.clean.seq_len


@dataclass(frozen=True)
class Prepared:
    """Metrics made :class:`Metric` objects and checked against one model and prompt length,
    with what they read there and the last block a patched forward must run: worked out once
    per patching call and handed to :func:`setup` (which binds them to the recorded runs)."""

    metrics: tuple[Metric, ...]
    needs: Needs
    last_layer: int
    seq_len: int


MetricsLike = Metric | Callable[..., Any] | str | Sequence[Any] | Prepared


def prepare_metrics(
    model: Any, metrics: MetricsLike, seq_len: int, clean: Tensor | None = None,
    corrupted: Tensor | None = None,
) -> Prepared:
    """Metrics (one or several) as :class:`Metric` objects, the union of what they read on
    ``model`` at ``seq_len`` tokens (positions checked before any forward) and their last
    layer; metric strings (``"massive_value:11:0:507"``) are parsed here, once, as the CLI
    parses them (a bare ``"logit_diff"`` takes its tokens from the runs :func:`setup`
    records). Already :class:`Prepared` metrics are returned as they are."""
    if isinstance(metrics, Prepared):
        if metrics.seq_len != seq_len:
            raise ValueError(f"metrics prepared for {metrics.seq_len} tokens, given {seq_len}.")
        return metrics
    many = isinstance(metrics, (list, tuple))
    items = list(metrics) if many else [metrics]  # type: ignore[list-item]
    if not items:
        raise BadInputError("no metric given.")
    ms = tuple(as_metric(m, model, clean, corrupted) for m in items)
    needs = Needs()
    for m in ms:
        needs = needs | resolve_needs(model, m, seq_len)
        m.check_seq_len(seq_len)
    return Prepared(ms, needs, last_layer_read(model, needs), seq_len)


def setup(
    model: Any,
    clean: TokensLike,
    corrupted: TokensLike | None,
    metrics: MetricsLike,
    *,
    prepend_bos: bool = True,
    keep: dict[str, set[str]] | None = None,
    last_layer: int | None = None,
) -> Setup:
    """Check the inputs, record the clean (and corrupted) run, bind the metrics to both runs
    (:meth:`~mechsink.patching.metrics.Metric.bind_runs`) and evaluate them on both. ``metrics``
    as :func:`prepare_metrics` takes them (a caller that prepared them already passes the
    :class:`Prepared`). ``keep`` names extra activations to record per input
    (``{"clean": {...}, "corrupted": {...}}``); ``last_layer`` ends the recorded runs after
    that block (every patched run must stop there too: see :func:`last_layer_read`)."""
    clean_t = as_tokens(model, clean, prepend_bos=prepend_bos)
    corr_t = None if corrupted is None else as_tokens(model, corrupted, prepend_bos=prepend_bos)
    if corr_t is not None:
        check_pair(clean_t, corr_t)
    prepared = prepare_metrics(model, metrics, clean_t.shape[1], clean_t, corr_t)
    ms, needs = prepared.metrics, prepared.needs
    keep = keep or {}
    base = names_for(model, needs)
    with torch.no_grad():
        clean_names = base | keep.get("clean", set())
        corr_names = base | keep.get("corrupted", set())
        if corr_t is None:
            clean_run, corr_run = record(model, clean_t, clean_names, last_layer), None
        else:
            clean_run, corr_run = record_pair(model, clean_t, corr_t, clean_names, corr_names,
                                              last_layer)
        clean_out = outputs_of(model, clean_run, needs)
        corr_out = None if corr_run is None else outputs_of(model, corr_run, needs)
        ms = tuple(m.bind_runs(clean_out, corr_out) for m in ms)
        dtype = true_dtype(model)
        clean_values = tuple(check_value(m(clean_out), "on the clean run", m, dtype)
                             for m in ms)
        corr_values: tuple[Tensor | None, ...] = tuple(None for _ in ms)
        if corr_out is not None:
            corr_values = tuple(check_value(m(corr_out), "on the corrupted run", m, dtype)
                                for m in ms)
    return Setup(model, clean_run, corr_run, ms, needs, clean_values, corr_values,
                 prepared.last_layer)


def _position_axis(name: str) -> int:
    """Where a hook's activation holds positions (queries for attention patterns/scores)."""
    kind = kind_of_hook(name)
    return 1 if kind is None else kind.pos_dim


def _repeat(t: Tensor, n: int) -> Tensor:
    return t if n == 1 else t.repeat(n, *[1] * (t.ndim - 1))


def reused_prefix(base: Run, first: int) -> int:
    """How many leading positions a patched run of patches at positions ``>= first`` takes
    from ``base`` (its keys and values recorded) instead of computing them: ``first``, or 0
    when the model records no keys/values (or prefix reuse is switched off)."""
    return first if (first > 0 and base.kv is not None and SPEEDUPS["prefix_reuse"]) else 0


def run_patched(
    model: Any,
    base: Run,
    metrics: Sequence[Metric],
    needs: Needs,
    resid: Float[Tensor, "rows pos d_model"],
    start: int,
    n: int,
    hooks: Sequence[tuple[str, HookFn]],
    *,
    first: int = 0,
    stacked: bool = False,
    joins: Sequence[int] | None = None,
    context: str = "",
    grad: bool = False,
) -> list[list[Tensor]]:
    """Run ``n`` stacked copies of ``resid`` (the residual entering block ``start``) with
    ``hooks``; return ``values[metric][copy]``.

    ``joins`` (non-decreasing, ``joins[0] == start``) is the block at which each copy enters
    the batch: copy ``i`` starts from ``base``'s residual entering block ``joins[i]``, so a
    copy patched at a later layer never recomputes the blocks before it (the staircase).
    ``resid`` is then the copies joining at ``start`` only, and hooks see, in block ``L``,
    the copies that joined at or before ``L`` (those joining at ``L`` last).

    ``base`` is the unpatched run the copies equal upstream of the patch: hooks the metrics
    read before ``start`` come from it, and with ``first = p > 0`` (every patch at positions
    ``>= p``) only positions ``p..`` are computed; positions ``< p`` come from ``base``
    (activations and keys/values; see :func:`reused_prefix`). Patch hooks then see positions
    ``p..`` only. ``resid`` is
    one copy (repeated here) or, with ``stacked``, already ``n`` copies (copy-major).

    Values are float64 scalars, checked finite. With ``grad`` the forward records gradients
    and each value is the metric's own 0-d tensor, for the caller's backward pass (``resid``
    or the hooked activations should require grad).
    """
    batch, seq_len = base.batch, base.seq_len
    p = reused_prefix(base, first)
    final = final_resid(model)
    captured: dict[str, Tensor] = {}
    joins = [start] * n if joins is None else list(joins)
    if len(joins) != n or joins[0] != start or sorted(joins) != joins or (stacked and any(
            j != start for j in joins)):
        raise ValueError(f"joins must be {n} non-decreasing layers starting at {start}.")
    grow = growth_hooks(base, joins, start, p)

    def capture_as(name: str) -> HookFn:  # keyed by the name asked for (hooks have aliases)
        def capture(act: Tensor, hook: Any) -> None:
            captured[name] = act

        return capture

    before = {h for h in needs.hooks if (layer_of(h) if layer_of(h) is not None else -1) < start}
    wanted = set(needs.hooks) - before
    positions = needs.logits if isinstance(needs.logits, tuple) else None
    if positions is not None and max(positions) >= p:
        wanted.add(final)
    rows = resid if stacked else _repeat(resid, joins.count(start))
    logits = None
    values: list[list[Tensor]] = [[] for _ in metrics]
    with torch.enable_grad() if grad else torch.no_grad():
        if needs.logits == ALL or wanted:
            early = needs.logits != ALL and SPEEDUPS["early_stop"]
            prefix: tuple[Any, ...] | None = None
            if p and base.kv is not None:
                n_layers = int(model.cfg.n_layers)
                prefix = (base.kv, p) if len(grow) == 0 else (
                    base.kv, p, [sum(j <= layer for j in joins) for layer in range(n_layers)])
            logits = run_from_layer(
                model, rows[:, p:], start,
                fwd_hooks=grow + list(hooks) + [(h, capture_as(h)) for h in sorted(wanted)],
                stop_after=tuple(sorted(wanted)) if early else (),
                prefix=prefix,  # type: ignore[arg-type]
            )
        acts, logits = _complete(model, base, needs, captured, logits, before, joins, p)
        dtype = true_dtype(model)  # non-finite values: the advice names the model's dtype
        for i in range(n):
            sel = slice(i * batch, (i + 1) * batch)
            out = Outputs(seq_len, {h: a[sel] for h, a in acts.items()},
                          None if logits is None or needs.logits is None else logits[sel],
                          positions)
            for j, metric in enumerate(metrics):
                value = metric(out)
                checked = check_value(value.detach() if isinstance(value, Tensor) else value,
                                      f"{context} (patch {i})", metric, dtype)
                values[j].append(torch.as_tensor(value) if grad else checked)
    return values


def _complete(
    model: Any, base: Run, needs: Needs, captured: dict[str, Tensor], logits: Tensor | None,
    before: set[str], joins: list[int], p: int,
) -> tuple[dict[str, Tensor], Tensor | None]:
    """What the metrics read, for every copy: the captured activations with the positions
    ``< p`` and the copies that had not joined yet taken from ``base``, and the logits."""
    n = len(joins)
    final = final_resid(model)
    acts: dict[str, Tensor] = {}
    for h in needs.hooks:
        if h in before:
            acts[h] = _repeat(base.acts[h], n)
            continue
        layer = layer_of(h)
        present = n if layer is None else sum(j <= layer for j in joins)
        got = captured[h]
        if p:
            axis = _position_axis(h)
            got = torch.cat([_repeat(base.acts[h].narrow(axis, 0, p), present), got], axis)
        acts[h] = got if present == n else torch.cat([got, _repeat(base.acts[h], n - present)])
    if isinstance(needs.logits, tuple):
        cols = [captured[final][:, q - p] if q >= p else _repeat(base.acts[final][:, q], n)
                for q in needs.logits]
        logits = unembed(model, torch.stack(cols, 1))
    elif needs.logits == ALL and p:
        logits = torch.cat([_repeat(base.logits[:, :p], n),  # type: ignore[index]
                            logits], 1)  # type: ignore[list-item]
    return acts, logits


def growth_hooks(base: Run, joins: list[int], start: int, p: int) -> list[tuple[str, HookFn]]:
    """Hooks that append, entering block ``L``, the copies that join there: ``base``'s own
    residual at ``L`` (positions ``p..``), to be patched by the caller's hooks of block ``L``.

    ``joins[i]`` is the block copy ``i`` joins at (sorted, ``joins[0] == start``): the staircase
    the engine runs on, and path patching's sender run too."""
    hooks: list[tuple[str, HookFn]] = []
    for layer in sorted(set(joins) - {start}):
        name = act_name("resid_pre", layer)
        new = _repeat(base.acts[name][:, p:], joins.count(layer))

        def append(act: Tensor, hook: Any, _new: Tensor = new) -> Tensor:
            return torch.cat([act, _new.to(act.dtype)], 0)

        hooks.append((name, append))
    return hooks


def fill(
    shape: tuple[int, ...], index: dict[tuple[int, ...], tuple[int, ...]],
    values: dict[tuple[int, ...], Tensor],
) -> Tensor:
    """The result grid: ``values[unit]`` at ``index[unit]`` (float64)."""
    out = torch.empty(shape, dtype=torch.float64)
    for unit, cell in index.items():
        out[cell] = values[unit]
    return out


def progress(total: int, desc: str) -> Any:
    """A progress bar for a sweep (:func:`mechsink.progress.bar`): shown after 2 s, on a
    terminal or in Jupyter, unless switched off (``mechsink.progress.set_progress(False)``)."""
    from mechsink.progress import bar

    return bar(total, desc, unit="patch")
