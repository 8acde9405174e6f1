"""Tokens with an explicit BOS choice, checked against the model's vocabulary and context.

The sink at position 0 depends on what stands there, so mechsink never lets a tokenizer's own
default decide: :func:`to_tokens` asks ``prepend_bos`` every time. Every text mechsink
tokenises goes through :func:`encode`, which refuses a word the tokenizer can only map to its
unknown token (an organism's word-level tokenizer turns every English word into ``<bos>``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from mechsink.errors import BadInputError


class UnknownWordError(BadInputError):
    """Text holds a word outside the tokenizer's vocabulary (it would become the unknown token)."""


def _unknown_spans(tok: Any, text: str, ids: list[int], unk: int) -> list[str]:
    """The pieces of ``text`` the tokenizer mapped to ``unk`` (a literal unknown-token string
    written in the text is not one of them)."""
    if getattr(tok, "is_fast", False):
        offsets = tok(text, add_special_tokens=False, return_offsets_mapping=True)[
            "offset_mapping"]
        spans = [text[a:b] for i, (a, b) in zip(ids, offsets, strict=True) if i == unk]
    else:  # a slow tokenizer: find the words that encode to the unknown token
        spans = [w for w in text.split()
                 if unk in tok(w, add_special_tokens=False)["input_ids"]]
    return [s for s in spans if s.strip() != str(tok.unk_token)]


def _vocab_example(tok: Any, k: int = 5) -> str:
    special = set(tok.all_special_tokens)
    words = [w for w, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
             if w not in special][:k]
    return " ".join(words)


def encode(tok: Any, text: str, *, index: int | None = None) -> list[int]:
    """Token ids of ``text`` without special tokens; raises :class:`UnknownWordError` (one
    line naming the first unknown word) when the tokenizer would map part of it to its unknown
    token. ``index`` says which of several texts this is, for the message."""
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    unk = getattr(tok, "unk_token_id", None)
    if unk is None or unk not in ids:
        return ids
    unknown = _unknown_spans(tok, text, ids, unk)
    if not unknown:
        return ids
    which = f" (text {index})" if index is not None else ""
    raise UnknownWordError(
        f"{unknown[0]!r}{which} is not in this model's vocabulary: its tokenizer would turn it "
        f"into {tok.unk_token!r}, its unknown token. Use the model's own words "
        f"(e.g. {_vocab_example(tok)!r}) or pass token ids."
    )


def tokenizer_of(model: Any) -> Any:
    """The model's tokenizer; raises a clear error when the model has none."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise BadInputError("this model has no tokenizer: pass token ids instead of text.")
    return tok


def bos_token_id(model: Any) -> int | None:
    """The id mechsink prepends when ``prepend_bos=True`` (None if the tokenizer has no BOS)."""
    tok = getattr(model, "tokenizer", None)
    return None if tok is None else tok.bos_token_id


def use_bos(model: Any, bos: bool | None) -> bool:
    """Whether a text starts with the BOS token: as asked, else where the model has one."""
    has = bos_token_id(model) is not None
    if bos and not has:
        raise BadInputError("bos=True but this tokenizer has no BOS token: use bos=False.")
    return has if bos is None else bool(bos)


def to_tokens(
    model: Any,
    text: str | Sequence[str],
    *,
    prepend_bos: bool,
    seq_len: int | None = None,
) -> Int[Tensor, "batch pos"]:
    """Tokenise text with an explicit BOS choice (the tokenizer's own default is ignored).

    Each text is encoded without special tokens (:func:`encode`: a word outside the vocabulary
    is an error), then the tokenizer's BOS token is put in front when ``prepend_bos``. With
    ``seq_len`` every row is cut to that length (a text that is too short is an error); without
    it, all texts must give the same number of tokens.
    """
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise BadInputError("no text given: pass a string or a non-empty list of strings.")
    tok = tokenizer_of(model)
    bos = tok.bos_token_id
    if prepend_bos and bos is None:
        raise BadInputError(
            "prepend_bos=True but this tokenizer has no BOS token; use prepend_bos=False."
        )
    rows = []
    for i, t in enumerate(texts):
        ids = encode(tok, t, index=i if len(texts) > 1 else None)
        if prepend_bos:
            ids = [bos, *ids]
        rows.append(ids)
    if seq_len is not None:
        short = [i for i, r in enumerate(rows) if len(r) < seq_len]
        if short:
            raise BadInputError(
                f"text {short[0]} gives {len(rows[short[0]])} tokens, fewer than seq_len={seq_len}:"
                " give longer texts or a smaller seq_len."
            )
        rows = [r[:seq_len] for r in rows]
    lengths = {len(r) for r in rows}
    if len(lengths) != 1:
        raise BadInputError(
            f"texts tokenise to different lengths {sorted(lengths)}: pass seq_len=N to cut them "
            "to a common length."
        )
    if 0 in lengths:
        raise BadInputError("the text tokenises to zero tokens.")
    device = getattr(model.cfg, "device", None) or "cpu"
    tokens = torch.tensor(rows, dtype=torch.long, device=device)
    check_seq_len(model, tokens.shape[1])
    return tokens


def check_tokens(model: Any, tokens: Tensor) -> None:
    """Raise before any work when a token tensor is not integer or holds ids outside the
    model's vocabulary (an embedding lookup would fail deep inside the forward, or on some
    devices silently read garbage)."""
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise BadInputError(f"tokens must be integer ids, got a {tokens.dtype} tensor.")
    if tokens.numel() == 0:
        raise BadInputError("the token tensor is empty.")
    vocab = int(model.cfg.d_vocab)
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise BadInputError(
            f"token id {bad} is outside this model's vocabulary (0..{vocab - 1}): pass ids from "
            "this model's tokenizer (mechsink.model.to_tokens)."
        )


def token_strings(model: Any, tokens: Sequence[int] | Tensor) -> list[str]:
    """Readable strings for one row of token ids (the ids as text when there is no tokenizer)."""
    ids = [int(t) for t in (tokens.tolist() if isinstance(tokens, Tensor) else tokens)]
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return [str(i) for i in ids]
    return [tok.decode([i]) for i in ids]


def context_length(model: Any) -> int:
    """The longest sequence the model accepts."""
    return int(model.cfg.n_ctx)


def check_seq_len(model: Any, seq_len: int) -> None:
    """Raise before any work when a sequence would not fit the model's context."""
    n_ctx = context_length(model)
    if seq_len < 1:
        raise BadInputError(f"sequence length must be at least 1, got {seq_len}.")
    if seq_len > n_ctx:
        raise BadInputError(
            f"sequence length {seq_len} is longer than the model's context ({n_ctx} tokens): "
            "use a shorter sequence."
        )

