"""Streaming perplexity: a long text read through a window of recent tokens plus the first few
(Xiao et al. 2024, "Efficient Streaming Language Models with Attention Sinks").

Each token ``t`` is predicted from a context of the first ``s`` tokens of the text (the kept
*sink* tokens) followed by the ``W`` tokens before ``t``; the window's positions are
re-assigned within it, ``0 .. s + W - 1``, as StreamingLLM assigns positions within its cache.

**The recompute formulation.** StreamingLLM keeps a KV cache of ``s + W`` entries and, on a
rotary model, rotates every cached key by its position *in the cache*, not in the text. Here
each window is run as a fresh sequence ``[first s tokens] + [last W tokens]`` with positions
``0 .. s + W - 1``: every kept token sits at the very position the cache assigns it, so the
rotation each query-key pair sees is the one StreamingLLM's re-assigned positions give (in
the first block, whose keys and values come from the tokens alone, the two are identical).
Above the first block a cache holds each token's state as it was computed when the token was
read, from the context it saw then (tokens since evicted included); recomputation reads every
kept token again from the window alone. That is the exact model of "the context is these
``s + W`` tokens at re-assigned positions" (Xiao et al.'s sliding window with re-computation,
plus the kept first tokens); it costs ``O(n W)`` token forwards, batched over windows of
equal length.

Every configuration scores the same tokens: ``t >= max(s) + max(W)``, where every window is
full. The dense baseline reads the whole text in one forward (the same tokens scored). With
``edits`` (hook-level interventions, e.g. the super-neuron set zeroed at position 0) every
forward runs under them: position 0 of a window is its first kept token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model.tokens import use_bos

DEFAULT_WINDOWS = (16, 64, 128)
DEFAULT_SINKS = (0, 1, 4)
DEFAULT_TOKENS = 1024
BATCH_TOKENS = 8192  # tokens per batch of windows (at most 64 windows)


def check_streaming_args(windows: Sequence[int], sinks: Sequence[int], n_tokens: int,
                         context: int | None = None) -> None:
    """Every check that needs no model: positive windows, sink counts >= 0, a text long enough
    to score at least one token with every window full, and (given) within the context."""
    for what, values, low in (("windows", windows, 1), ("sinks", sinks, 0)):
        if isinstance(values, str) or not values or \
                any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
            raise BadInputError(f"{what} takes a non-empty list of integers >= {low}, got "
                                f"{values!r}.")
    start = max(windows) + max(sinks)
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens <= start:
        raise BadInputError(f"n_tokens={n_tokens!r} scores nothing: the first token scored is "
                            f"max(windows) + max(sinks) = {start}; give more tokens or smaller "
                            "windows.")
    if context is not None and n_tokens > context:
        raise BadInputError(f"n_tokens={n_tokens} is longer than the model's context "
                            f"({context}); the dense baseline reads the whole text at once.")


def window_tokens(
    tokens: Int[Tensor, " n"], targets: Sequence[int], sinks: int, window: int,
) -> Int[Tensor, "m ctx"]:
    """For each target index ``t``, the context ``tokens[:sinks] + tokens[t - window:t]``
    (every ``t >= sinks + window``)."""
    if min(targets) < sinks + window:
        raise BadInputError(f"target {min(targets)} has no full window of {window} after "
                            f"{sinks} kept tokens.")
    idx = torch.tensor(list(targets))[:, None] + torch.arange(-window, 0)[None]
    recent = tokens[idx.to(tokens.device)]
    first = tokens[:sinks][None].expand(len(targets), sinks)
    return torch.cat([first, recent], 1)


def last_logits(model: Any, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch vocab"]:
    """The logits at the last position only (transformers' ``logits_to_keep=1`` where the model
    takes it: no ``[batch, pos, vocab]`` tensor; else the full forward's last row)."""
    try:
        logits = model(tokens, logits_to_keep=1)
    except TypeError:  # a HookedTransformer has no such argument
        logits = model(tokens)
    return logits[:, -1]


@torch.no_grad()
def window_nll(
    model: Any, tokens: Int[Tensor, " n"], targets: Sequence[int], sinks: int, window: int,
    *, batch_size: int | None = None,
) -> Float[Tensor, " m"]:
    """Negative log-likelihood of ``tokens[t]`` for each target ``t`` under its streaming
    window (:func:`window_tokens`), the windows run in batches."""
    step = batch_size or max(1, min(64, BATCH_TOKENS // (sinks + window)))
    out = []
    for i in range(0, len(targets), step):
        chunk = list(targets[i:i + step])
        logits = last_logits(model, window_tokens(tokens, chunk, sinks, window)).float()
        target = tokens[torch.tensor(chunk, device=tokens.device)].to(logits.device)
        out.append(F.cross_entropy(logits, target, reduction="none").cpu())
    return torch.cat(out).double()


@torch.no_grad()
def dense_nll(model: Any, tokens: Int[Tensor, " n"], targets: Sequence[int]
              ) -> Float[Tensor, " m"]:
    """Negative log-likelihood of ``tokens[t]`` for each target (``targets`` a contiguous
    range ending at the last token) with the whole text before it in context: one forward,
    logits kept from the first target's predecessor on where the model allows it."""
    keep = int(tokens.shape[0]) - min(targets) + 1
    try:
        logits = model(tokens[None], logits_to_keep=keep)[0]
    except TypeError:  # a HookedTransformer has no such argument
        logits = model(tokens[None])[0]
    logits = logits[-keep:-1]  # the predecessors of the targets, in order
    return F.cross_entropy(logits.float(), tokens[list(targets)].to(logits.device),
                           reduction="none").cpu().double()


@dataclass(frozen=True)
class StreamingResult:
    """Perplexity of one text per kept-token count ``s`` and window ``W`` (``table[s][W]``),
    the dense baseline, and the same under the circuit edits when they were given."""

    model: str
    n_tokens: int
    first_target: int
    windows: tuple[int, ...]
    sinks: tuple[int, ...]
    dense: float
    table: dict[int, dict[int, float]]
    first_tokens: list[str] = field(default_factory=list)
    edited: dict[str, Any] | None = None  # {"description", "dense", "table"} or not_applicable

    def to_dict(self) -> dict[str, Any]:
        def tab(t: dict[int, dict[int, float]]) -> dict[str, dict[str, float]]:
            return {str(s): {str(w): round(v, 4) for w, v in row.items()} for s, row in t.items()}

        edited = self.edited
        if edited is not None and "table" in edited:
            edited = {**edited, "dense": round(edited["dense"], 4),
                      "table": tab(edited["table"])}
        return {"schema": "mechsink-streaming/1", "model": self.model,
                "n_tokens": self.n_tokens, "scored": self.n_tokens - self.first_target,
                "first_target": self.first_target, "windows": list(self.windows),
                "sinks": list(self.sinks), "first_tokens": self.first_tokens,
                "method": "recompute: each window run as a fresh sequence [first s tokens] + "
                          "[last W tokens], positions 0..s+W-1 (Xiao et al. 2024's re-assigned "
                          "positions)",
                "dense_perplexity": round(self.dense, 4), "perplexity": tab(self.table),
                "circuit_removed": edited}


def perplexity_table(
    model: Any, tokens: Int[Tensor, " n"], windows: Sequence[int], sinks: Sequence[int],
    *, edits: Sequence[Any] = (), batch_size: int | None = None,
) -> tuple[float, dict[int, dict[int, float]]]:
    """Dense perplexity and ``table[s][W]`` over targets ``max(s) + max(W) .. n - 1``, every
    forward under ``edits`` (interventions; none: the clean model)."""
    targets = list(range(max(windows) + max(sinks), int(tokens.shape[0])))
    if edits:  # imported only when there are edits to apply
        from mechsink.interventions.edits import applied

        scope: Any = applied(model, list(edits))
    else:
        scope = nullcontext()
    with scope:
        dense = math.exp(float(dense_nll(model, tokens, targets).mean()))
        table = {s: {w: math.exp(float(window_nll(model, tokens, targets, s, w,
                                                  batch_size=batch_size).mean()))
                     for w in windows} for s in sinks}
    return dense, table


def streaming_text(model: Any, n_tokens: int, bos: bool | None = None) -> Int[Tensor, " n"]:
    """The first ``n_tokens`` tokens of the shipped Wikipedia extract's paragraphs (joined by
    blank lines, in order), after the model's BOS token when ``bos`` (None: where the model
    has one)."""
    from mechsink.inputs.corpus import natural_documents
    from mechsink.model import to_tokens

    text, bos = "", use_bos(model, bos)
    for doc in natural_documents():
        if doc.source != "wiki":
            continue
        text = f"{text}\n\n{doc.text}" if text else doc.text
        if len(text) > 8 * n_tokens:  # plenty: a token is rarely more than 8 characters
            break
    tokens = to_tokens(model, text, prepend_bos=bos)[0]
    if tokens.shape[0] < n_tokens:
        raise BadInputError(f"the Wikipedia extract gives {tokens.shape[0]} tokens, fewer than "
                            f"n_tokens={n_tokens}.")
    return tokens[:n_tokens]


def circuit_edits(model: Any, *, n: int = 16, seq_len: int = 64, seed: int = 0,
                  bos: bool | None = None) -> tuple[list[Any], str]:
    """The sink circuit's edits: every complete super-neuron set that builds the massive
    channel at position 0 (:func:`mechsink.interventions.readout.massive_channel_sets` on ``n``
    natural-text prompts of ``seq_len`` tokens, with BOS as ``bos``) zeroed at position 0;
    and what they are."""
    from mechsink.inputs.prompts import make_prompts
    from mechsink.interventions.readout import massive_channel_sets
    from mechsink.interventions.targets import neuron_sets
    variant = "bos" if use_bos(model, bos) else "nobos"
    prompts = make_prompts(model, "natural", variant, n=n, seq_len=seq_len, seed=seed)
    found = massive_channel_sets(model, prompts.tokens)
    sets = {lay: found.sets[lay].units for lay in found.builders}
    target = neuron_sets(model, sets, channels=[found.channel], positions=(0,))
    return target.edits(0.0), f"channel {found.channel}: zeroed {target.description}"


def streaming_perplexity(
    model: Any, *, windows: Sequence[int] = DEFAULT_WINDOWS, sinks: Sequence[int] = DEFAULT_SINKS,
    n_tokens: int = DEFAULT_TOKENS, circuit: bool = True, tokens: Tensor | None = None,
    batch_size: int | None = None, model_name: str | None = None, bos: bool | None = None,
) -> StreamingResult:
    """Streaming perplexity of the shipped Wikipedia extract (or of ``tokens``, one row) for
    every kept-token count in ``sinks`` and window in ``windows``; with ``circuit`` also with
    the sink circuit's super-neuron sets zeroed at position 0 (:func:`circuit_edits`; a model
    whose sets cannot be found says why in ``edited``). ``bos``: whether the text (and the
    prompts the sets are found on) start with the BOS token; None: where the model has one."""
    from mechsink.model import context_length, token_strings

    windows, sinks = tuple(windows), tuple(sinks)
    n = n_tokens if tokens is None else int(tokens.shape[-1])
    check_streaming_args(windows, sinks, n, context_length(model))
    text = streaming_text(model, n, bos) if tokens is None else tokens.reshape(-1)
    dense, table = perplexity_table(model, text, windows, sinks, batch_size=batch_size)
    edited: dict[str, Any] | None = None
    if circuit:
        try:
            edits, what = circuit_edits(model, bos=bos)
        except BadInputError as exc:
            edited = {"not_applicable": str(exc)}
        else:
            e_dense, e_table = perplexity_table(model, text, windows, sinks, edits=edits,
                                                batch_size=batch_size)
            edited = {"description": what, "dense": e_dense, "table": e_table}
    return StreamingResult(model_name or str(getattr(model.cfg, "model_name", "model")), n,
                           max(windows) + max(sinks), windows, sinks, dense, table,
                           token_strings(model, text[:max(sinks)]), edited)
