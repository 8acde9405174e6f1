"""Training data for organisms, as deterministic batch functions of (seed, step).

- ``BigramBackcopy``: the synthetic task of Guo et al. 2024 ("Active-Dormant Attention Heads"),
  known to grow attention sinks in tiny models. Tokens follow a fixed random bigram chain,
  except that after a *trigger* token the next token copies the token before the trigger.
- ``TextStream``: real English (the gensim news + Wikipedia text) tokenised with GPT-2's BPE.

Every sequence starts with the BOS token. A batch depends only on (seed, step), so a resumed
run sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

_STEP_STRIDE = 1_000_003  # keeps (seed, step) streams apart


def batch_rng(seed: int, step: int) -> np.random.Generator:
    """The random generator that draws batch ``step`` of a run with ``seed``."""
    return np.random.default_rng([seed, step, _STEP_STRIDE])


@dataclass(frozen=True)
class BigramBackcopy:
    """Bigram-Backcopy over ``vocab`` ordinary tokens plus BOS (id ``vocab``).

    The transition matrix and the trigger tokens are fixed by ``task_seed`` (not the run's
    seed), so runs with different seeds learn the same task.
    """

    vocab: int = 64
    n_triggers: int = 3
    concentration: float = 0.2  # Dirichlet concentration of each bigram row (small = peaky)
    task_seed: int = 0

    @property
    def bos(self) -> int:
        return self.vocab

    @property
    def vocab_size(self) -> int:
        return self.vocab + 1

    @cached_property
    def triggers(self) -> np.ndarray:
        return np.random.default_rng(self.task_seed).choice(
            self.vocab, self.n_triggers, replace=False
        )

    @cached_property
    def transition_cdf(self) -> np.ndarray:
        rng = np.random.default_rng(self.task_seed + 1)
        probs = rng.dirichlet(np.full(self.vocab, self.concentration), size=self.vocab)
        return np.cumsum(probs, axis=1)

    def batch(self, seed: int, step: int, batch_size: int, seq_len: int) -> Int[Tensor, "b t"]:
        """``batch_size`` sequences of ``seq_len`` tokens: BOS, then the chain."""
        rng = batch_rng(seed, step)
        out = np.empty((batch_size, seq_len), dtype=np.int64)
        out[:, 0] = self.bos
        is_trigger = np.zeros(self.vocab, dtype=bool)
        is_trigger[self.triggers] = True
        ordinary = np.flatnonzero(~is_trigger)
        if seq_len > 1:
            out[:, 1] = rng.choice(ordinary, batch_size)
        for t in range(2, seq_len):
            prev = out[:, t - 1]
            u = rng.random(batch_size)
            cdf = self.transition_cdf[prev]
            drawn = np.minimum((cdf < u[:, None]).sum(axis=1), self.vocab - 1)
            out[:, t] = np.where(is_trigger[prev], out[:, t - 2], drawn)
        return torch.from_numpy(out)

    def tokenizer(self) -> Any:
        """A word-level tokenizer ("t0" ... "t{vocab-1}", "<bos>") so organisms save and load."""
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {f"t{i}": i for i in range(self.vocab)} | {"<bos>": self.bos}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<bos>"))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>",
                                       eos_token="<bos>", unk_token="<bos>")


def task_of_tokenizer(tok: Any) -> BigramBackcopy | None:
    """The Bigram-Backcopy task whose word-level tokenizer ``tok`` is ("t0" ... "t{V-1}" and
    "<bos>" = V, what :meth:`BigramBackcopy.tokenizer` writes), or None for any other tokenizer.

    An organism trained on it knows no English: its input suites are drawn from this task.
    """
    vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else {}
    size = len(vocab) - 1
    if size < 2 or vocab.get("<bos>") != size:
        return None
    if any(vocab.get(f"t{i}") != i for i in range(size)):
        return None
    return BigramBackcopy(vocab=size)


@dataclass(frozen=True)
class TextStream:
    """Windows of real English tokenised with GPT-2's BPE, each preceded by BOS (50256)."""

    bos: int = 50256
    vocab_size: int = 50257

    def batch(self, seed: int, step: int, batch_size: int, seq_len: int) -> Int[Tensor, "b t"]:
        stream = _text_tokens()
        rng = batch_rng(seed, step)
        starts = rng.integers(0, len(stream) - seq_len, batch_size)
        rows = np.stack([stream[s: s + seq_len - 1] for s in starts])
        bos = np.full((batch_size, 1), self.bos, dtype=np.int64)
        return torch.from_numpy(np.concatenate([bos, rows], axis=1))

    def tokenizer(self) -> Any:
        from mechsink.model.zoo import gpt2_tokenizer

        return gpt2_tokenizer()


@lru_cache(maxsize=1)
def _text_tokens() -> np.ndarray:
    """All natural documents as one GPT-2 token stream, documents separated by <|endoftext|>.

    Cached on disk beside the tokenizer (a few seconds to build, once; rebuilt if damaged).
    """
    from mechsink.inputs.corpus import natural_documents
    from mechsink.model import assets
    from mechsink.model.zoo import gpt2_tokenizer

    path = assets.cache_dir() / "data" / "natural-gpt2-tokens.npy"
    if path.is_file():
        try:
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:  # damaged: build it again, saying so
            import sys

            print(f"mechsink: the cached {path} is damaged ({exc}); building it again.",
                  file=sys.stderr, flush=True)
    tok = gpt2_tokenizer()
    ids: list[int] = []
    for doc in natural_documents():
        ids.extend(tok(doc.text, add_special_tokens=False)["input_ids"])
        ids.append(tok.eos_token_id)
    arr = np.asarray(ids, dtype=np.int64)
    _save_npy_atomic(path, arr)
    return arr


def _save_npy_atomic(path: Path, arr: np.ndarray) -> None:
    import io

    from mechsink.io import atomic_write_bytes

    buf = io.BytesIO()
    np.save(buf, arr)
    atomic_write_bytes(path, buf.getvalue())
