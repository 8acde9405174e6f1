"""Input suites for sink measurements: natural text, random tokens, one repeated token.

Each suite comes in three first-token variants (a sink result always states its input suite):

- ``bos``: the model's BOS token at position 0, then the body;
- ``nobos``: the body starts at position 0 (no special token anywhere);
- ``randfirst``: a random ordinary token at position 0, then the body.

Every suite draws one *body* of T ordinary tokens per sequence from its seed; ``nobos`` uses the
whole body, ``bos`` and ``randfirst`` put their first token in front of its first T-1 tokens.
So the variants of one suite differ only in what sits at position 0 (and, for ``nobos``, a
shift by one). Bodies: ``natural`` tokenises news articles and Wikipedia paragraphs from their
start (see :mod:`mechsink.inputs.corpus`), or, for an organism trained on Bigram-Backcopy (whose
vocabulary holds no English word), draws sequences of its own task
(:func:`mechsink.inputs.tasks.task_of_tokenizer`); ``random`` draws T ordinary tokens uniformly;
``repeated`` draws one ordinary token and repeats it. "Ordinary" excludes every special or added
token. Text is tokenised by :func:`mechsink.model.tokens.encode` only (a word outside the
vocabulary is an error), and a natural or custom suite whose tokens are all one id is refused.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model import bos_token_id, check_seq_len, tokenizer_of
from mechsink.model.tokens import encode

SUITES = ("natural", "random", "repeated")
VARIANTS = ("bos", "nobos", "randfirst")
DEFAULT_N = 32
DEFAULT_SEQ_LEN = 64


@dataclass(frozen=True)
class PromptSet:
    """A batch of token sequences with a name saying what they are.

    ``suite`` is a suite name (or ``"custom"``), ``variant`` the first-token variant (or
    ``"given"`` for tokens passed in as they are), ``seed`` the seed that drew them.
    """

    suite: str
    variant: str
    tokens: Int[Tensor, "n pos"]
    seed: int | None = None

    @property
    def name(self) -> str:
        return f"{self.suite}/{self.variant}"

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    def digest(self) -> str:
        """sha256 of the token ids (int64, row-major): identical inputs give identical digests."""
        data = self.tokens.detach().to("cpu", torch.int64).contiguous().numpy().tobytes()
        return hashlib.sha256(data).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """What the suite was, without the tokens themselves (their digest stands in)."""
        return {
            "suite": self.suite, "variant": self.variant, "n": self.n, "seq_len": self.seq_len,
            "seed": self.seed, "tokens_sha256": self.digest(),
            "first_tokens": self.tokens[:, 0].tolist(),
        }


# --- validation ------------------------------------------------------------------------------


def check_suite_args(
    suites: Sequence[str], variants: Sequence[str], n: int, seq_len: int
) -> None:
    """Raise a clear error for an unknown suite or variant, or a count/length below its minimum."""
    for s in suites:
        if s not in SUITES:
            raise BadInputError(f"unknown suite {s!r}: choose from {', '.join(SUITES)}.")
    for v in variants:
        if v not in VARIANTS:
            raise BadInputError(
                f"unknown first-token variant {v!r}: choose from {', '.join(VARIANTS)}."
            )
    if not suites or not variants:
        raise BadInputError("give at least one suite and one first-token variant.")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BadInputError(f"n (sequences per suite) must be a positive integer, got {n!r}.")
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
        raise BadInputError(
            f"seq_len must be an integer of at least 2 (a key at position 0 and a query after "
            f"it), got {seq_len!r}."
        )


# --- vocabulary ------------------------------------------------------------------------------


def ordinary_token_ids(model: Any) -> Int[Tensor, " n_ordinary"]:
    """Token ids that are neither special nor added tokens, and that the model can embed."""
    tok = tokenizer_of(model)
    limit = min(len(tok), int(model.cfg.d_vocab))
    excluded = set(tok.all_special_ids) | set(getattr(tok, "added_tokens_decoder", {}) or {})
    bos = bos_token_id(model)
    if bos is not None:
        excluded.add(bos)
    keep = torch.ones(limit, dtype=torch.bool)
    keep[[i for i in excluded if 0 <= i < limit]] = False
    ids = torch.nonzero(keep).flatten()
    if ids.numel() < 2:
        raise BadInputError("the tokenizer has fewer than two ordinary tokens to draw from.")
    return ids


def _generator(seed: int, *parts: str) -> torch.Generator:
    """A CPU generator seeded from ``seed`` and a label (stable across runs and platforms)."""
    label = zlib.crc32("/".join(parts).encode())
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + label) % (2**63))


def _draw(ids: Tensor, shape: tuple[int, ...], gen: torch.Generator) -> Tensor:
    return ids[torch.randint(0, ids.numel(), shape, generator=gen)]


# --- bodies ----------------------------------------------------------------------------------


def _natural_bodies(model: Any, n: int, seq_len: int, seed: int) -> Tensor:
    """``n`` texts of at least ``seq_len`` tokens, each tokenised from its document's start (an
    organism's own task text instead, when its tokenizer is a task's)."""
    from mechsink.inputs.corpus import natural_documents
    from mechsink.inputs.tasks import task_of_tokenizer

    tok = tokenizer_of(model)
    task = task_of_tokenizer(tok)
    if task is not None:  # the task's chains, BOS column dropped (the variant decides pos 0)
        step = zlib.crc32(b"natural")  # a step no training run reaches: held-out sequences
        return task.batch(seed, step, n, seq_len + 1)[:, 1:].clone()
    docs = natural_documents()
    order = torch.randperm(len(docs), generator=_generator(seed, "natural", "order")).tolist()
    rows: list[list[int]] = []
    for i in order:
        text = docs[i].text
        ids = encode(tok, text[: 16 * seq_len])
        if len(ids) >= seq_len:
            rows.append(ids[:seq_len])
            if len(rows) == n:
                break
    if len(rows) < n:
        raise BadInputError(
            f"the natural corpus holds only {len(rows)} texts of at least {seq_len} tokens; "
            f"ask for n <= {len(rows)} or a shorter seq_len."
        )
    return torch.tensor(rows, dtype=torch.long)


def check_not_constant(model: Any, body: Tensor, suite: str) -> None:
    """Refuse a ``natural`` or custom suite whose tokens are all one id (a tokenizer that maps
    every word to one token would otherwise give the measurements a fake input)."""
    if suite == "repeated" or body.numel() < 2 or bool((body != body.flatten()[0]).any()):
        return
    token = int(body.flatten()[0])
    tok = getattr(model, "tokenizer", None)
    shown = f" ({tok.decode([token])!r})" if tok is not None else ""
    raise BadInputError(
        f"every token of the {suite} suite is id {token}{shown}: the texts do not tokenise into "
        "this model's vocabulary; give texts in the model's own words, or use the random suite."
    )


def _bodies(model: Any, suite: str, n: int, seq_len: int, seed: int) -> Tensor:
    if suite == "natural":
        return _natural_bodies(model, n, seq_len, seed)
    ids = ordinary_token_ids(model)
    gen = _generator(seed, suite, "body")
    if suite == "random":
        return _draw(ids, (n, seq_len), gen)
    if suite == "repeated":
        return _draw(ids, (n, 1), gen).expand(n, seq_len).clone()
    raise BadInputError(f"unknown suite {suite!r}: choose from {', '.join(SUITES)}.")


def _random_first(model: Any, body: Tensor, suite: str, seed: int) -> Tensor:
    """One random ordinary token per row, different from the row's next token."""
    ids = ordinary_token_ids(model)
    gen = _generator(seed, suite, "first")
    first = _draw(ids, (body.shape[0],), gen)
    clash = first == body[:, 0]
    while bool(clash.any()):
        first[clash] = _draw(ids, (int(clash.sum()),), gen)
        clash = first == body[:, 0]
    return first


def with_first_token(model: Any, body: Tensor, variant: str, *, suite: str, seed: int) -> Tensor:
    """Apply a first-token variant to a batch of bodies of length T (the result has length T)."""
    if variant == "nobos":
        return body.clone()
    if variant == "bos":
        bos = bos_token_id(model)
        if bos is None:
            raise BadInputError(
                "variant 'bos' needs a BOS token and this tokenizer has none: use nobos/randfirst."
            )
        first = torch.full((body.shape[0],), bos, dtype=torch.long)
    elif variant == "randfirst":
        first = _random_first(model, body, suite, seed)
    else:
        raise BadInputError(
            f"unknown first-token variant {variant!r}: choose from {', '.join(VARIANTS)}."
        )
    return torch.cat([first[:, None], body[:, :-1]], dim=1)


# --- public API ------------------------------------------------------------------------------


def make_prompts(
    model: Any,
    suite: str,
    variant: str = "bos",
    *,
    n: int = DEFAULT_N,
    seq_len: int = DEFAULT_SEQ_LEN,
    seed: int = 0,
) -> PromptSet:
    """``n`` sequences of ``seq_len`` tokens of one suite and first-token variant, from ``seed``."""
    check_suite_args([suite], [variant], n, seq_len)
    check_seq_len(model, seq_len)
    body = _bodies(model, suite, n, seq_len, seed)
    check_not_constant(model, body, suite)
    tokens = with_first_token(model, body, variant, suite=suite, seed=seed)
    return PromptSet(suite, variant, tokens.to(_device(model)), seed)


def prompts_from_texts(
    model: Any, texts: Sequence[str], variant: str = "bos", *, seq_len: int, seed: int = 0
) -> PromptSet:
    """A user's own texts, cut to ``seq_len`` tokens, with a first-token variant applied."""
    if isinstance(texts, str) or not texts:
        raise BadInputError("texts must be a non-empty list of strings.")
    check_suite_args(["natural"], [variant], len(texts), seq_len)
    check_seq_len(model, seq_len)
    tok = tokenizer_of(model)
    rows = []
    for i, t in enumerate(texts):
        ids = encode(tok, t, index=i)
        if len(ids) < seq_len:
            raise BadInputError(
                f"text {i} gives {len(ids)} tokens, fewer than seq_len={seq_len}: give longer "
                "texts or a smaller seq_len."
            )
        rows.append(ids[:seq_len])
    body = torch.tensor(rows, dtype=torch.long)
    check_not_constant(model, body, "custom")
    tokens = with_first_token(model, body, variant, suite="custom", seed=seed)
    return PromptSet("custom", variant, tokens.to(_device(model)), seed)


def prompts_from_tokens(
    model: Any, tokens: Int[Tensor, "n pos"], *, name: str = "custom"
) -> PromptSet:
    """A user's own token ids, used exactly as given (variant ``given``)."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.dtype.is_floating_point:
        raise BadInputError("tokens must be a 2-D integer tensor [n, seq_len].")
    n, seq_len = tokens.shape
    check_suite_args(["natural"], ["bos"], int(n), int(seq_len))
    check_seq_len(model, int(seq_len))
    d_vocab = int(model.cfg.d_vocab)
    if int(tokens.min()) < 0 or int(tokens.max()) >= d_vocab:
        raise BadInputError(f"token ids must lie in [0, {d_vocab}): got {int(tokens.min())}.."
                            f"{int(tokens.max())}.")
    return PromptSet(name, "given", tokens.long().to(_device(model)), None)


def _device(model: Any) -> torch.device:
    return torch.device(getattr(model.cfg, "device", None) or "cpu")
