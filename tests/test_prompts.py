"""Input suites: each variant really is what it says (inspect the tokens), seeds reproduce."""

from __future__ import annotations

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.inputs.corpus import natural_documents, strip_templates, wiki_paragraphs
from mechsink.inputs.prompts import (
    make_prompts,
    ordinary_token_ids,
    prompts_from_texts,
    prompts_from_tokens,
)
from mechsink.model import bos_token_id


def _special(model) -> set[int]:
    tok = model.tokenizer
    return set(tok.all_special_ids) | set(tok.added_tokens_decoder) | {bos_token_id(model)}


@pytest.mark.parametrize("suite", ["natural", "random", "repeated"])
def test_variants_differ_only_in_position_zero(gpt2_tiny, suite):
    sets = {v: make_prompts(gpt2_tiny, suite, v, n=4, seq_len=10, seed=3)
            for v in ("bos", "nobos", "randfirst")}
    bos, nobos, rand = (sets[v].tokens for v in ("bos", "nobos", "randfirst"))
    for t in (bos, nobos, rand):
        assert t.shape == (4, 10) and t.dtype == torch.long
    assert (bos[:, 0] == bos_token_id(gpt2_tiny)).all()
    assert torch.equal(bos[:, 1:], nobos[:, :-1])  # same body, BOS in front
    assert torch.equal(rand[:, 1:], nobos[:, :-1])
    special = _special(gpt2_tiny)
    assert not set(nobos.flatten().tolist()) & special  # no BOS, no special token anywhere
    assert not set(rand.flatten().tolist()) & special
    assert not set(bos[:, 1:].flatten().tolist()) & special
    assert (rand[:, 0] != rand[:, 1]).all()


def test_repeated_is_one_token_repeated(llama_tiny):
    nobos = make_prompts(llama_tiny, "repeated", "nobos", n=5, seq_len=8, seed=1).tokens
    assert (nobos == nobos[:, :1]).all()
    assert len(set(nobos[:, 0].tolist())) > 1  # a different token per sequence
    bos = make_prompts(llama_tiny, "repeated", "bos", n=5, seq_len=8, seed=1).tokens
    assert (bos[:, 0] == bos_token_id(llama_tiny)).all()
    assert (bos[:, 1:] == nobos[:, :1]).all()
    rand = make_prompts(llama_tiny, "repeated", "randfirst", n=5, seq_len=8, seed=1).tokens
    assert (rand[:, 1:] == nobos[:, :1]).all() and (rand[:, 0] != nobos[:, 0]).all()


def test_random_tokens_are_ordinary_and_seeded(llama_tiny):
    a = make_prompts(llama_tiny, "random", "nobos", n=3, seq_len=20, seed=7)
    b = make_prompts(llama_tiny, "random", "nobos", n=3, seq_len=20, seed=7)
    c = make_prompts(llama_tiny, "random", "nobos", n=3, seq_len=20, seed=8)
    assert torch.equal(a.tokens, b.tokens) and a.digest() == b.digest()
    assert not torch.equal(a.tokens, c.tokens)
    ordinary = set(ordinary_token_ids(llama_tiny).tolist())
    assert set(a.tokens.flatten().tolist()) <= ordinary
    assert len(set(a.tokens.flatten().tolist())) > 50  # uniform, not one token


def test_natural_text_starts_at_a_document_start(gpt2_tiny):
    p = make_prompts(gpt2_tiny, "natural", "nobos", n=6, seq_len=16, seed=0)
    starts = {d.text[:40] for d in natural_documents()}
    for row in p.tokens:
        text = gpt2_tiny.tokenizer.decode(row.tolist())
        assert any(s.startswith(text[:30]) for s in starts), text
        assert "[[" not in text and "{{" not in text and "<ref" not in text


def test_natural_corpus_has_news_and_wiki():
    docs = natural_documents()
    sources = {d.source for d in docs}
    assert sources == {"news", "wiki"}
    assert sum(d.source == "news" for d in docs) == 300


def test_wiki_markup_is_stripped():
    raw = ("{{Infobox|name=x {{nested}}}}'''Anarchism''' is a [[political philosophy]] that "
           "advocates [[Self-governance|self-governed]] societies.<ref>Some ref</ref> "
           "It is [http://example.org often] described as ''anti-authoritarian''. "
           "[[File:A.png|thumb|caption [[link]] here]]" + " More text here." * 12 +
           "\n\n== Heading ==\n* a list item\n{| table |}\n")
    (para,) = wiki_paragraphs(raw)
    assert para.startswith("Anarchism is a political philosophy that advocates self-governed "
                           "societies. It is often described as anti-authoritarian.")
    for junk in ("[[", "]]", "{{", "}}", "<ref", "'''", "Heading", "list item", "thumb"):
        assert junk not in para
    assert strip_templates("a {{b {{c}} d}} e {|x|} f") == "a  e  f"


def test_user_texts_and_tokens(gpt2_tiny):
    texts = ["The quick brown fox jumps over the lazy dog again and again and again."] * 2
    p = prompts_from_texts(gpt2_tiny, texts, "bos", seq_len=6)
    assert p.tokens.shape == (2, 6) and (p.tokens[:, 0] == bos_token_id(gpt2_tiny)).all()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    q = prompts_from_tokens(gpt2_tiny, ids, name="mine")
    assert torch.equal(q.tokens, ids) and q.variant == "given" and q.suite == "mine"
    with pytest.raises(BadInputError, match="fewer than seq_len"):
        prompts_from_texts(gpt2_tiny, ["short"], "bos", seq_len=6)
    with pytest.raises(BadInputError, match="token ids"):
        prompts_from_tokens(gpt2_tiny, torch.tensor([[1, 10**6]]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(suite="poetry"), "unknown suite"),
        (dict(variant="eos"), "unknown first-token variant"),
        (dict(n=0), "n .sequences per suite. must be a positive integer"),
        (dict(seq_len=0), "seq_len must be an integer of at least 2"),
        (dict(seq_len=1000), "longer than the model's context"),
    ],
)
def test_bad_suite_arguments_are_clear_errors(gpt2_tiny, kwargs, match):
    args = dict(suite="random", variant="bos", n=2, seq_len=8) | kwargs
    suite, variant = args.pop("suite"), args.pop("variant")
    with pytest.raises(BadInputError, match=match):
        make_prompts(gpt2_tiny, suite, variant, **args)
