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


# --- text outside the vocabulary, and suites that are one token (#29 item 2) -----------------


@pytest.fixture(scope="module")
def organism():
    from mechsink import load_model

    return load_model("organism:bb-gpt2-tiny", device="cpu")


def test_organism_refuses_english_naming_the_first_unknown_word(organism):
    from mechsink.model import to_tokens
    from mechsink.model.tokens import UnknownWordError

    with pytest.raises(UnknownWordError, match=r"^'hello' is not in this model's vocabulary"):
        to_tokens(organism, "t1 t2 hello world", prepend_bos=True)
    with pytest.raises(UnknownWordError, match=r"'dog' \(text 1\)"):
        to_tokens(organism, ["t1 t2 t3", "t4 dog t5"], prepend_bos=False)
    with pytest.raises(UnknownWordError, match="'cat'"):  # the suites' path is checked too
        prompts_from_texts(organism, ["t1 t2 t3 t4", "cat t1 t2 t3"], "bos", seq_len=3)
    # its own words, and the literal BOS token, are fine
    ids = to_tokens(organism, "t1 t2 <bos> t3", prepend_bos=True)
    assert ids.tolist() == [[64, 1, 2, 64, 3]]


def test_byte_level_tokenizers_keep_every_text(gpt2_tiny):
    from mechsink.model import to_tokens

    ids = to_tokens(gpt2_tiny, "zxqv <|endoftext|> ünïcödé", prepend_bos=False)
    assert 50256 in ids.tolist()[0]  # the literal special token is not an unknown word


def test_organism_natural_suite_is_its_own_task(organism):
    from mechsink.inputs.tasks import BigramBackcopy, task_of_tokenizer

    assert task_of_tokenizer(organism.tokenizer) == BigramBackcopy()
    p = make_prompts(organism, "natural", "nobos", n=6, seq_len=16, seed=1)
    body = p.tokens
    assert body.shape == (6, 16) and int(body.max()) < 64  # no <bos> (64) in the body
    assert len(set(body.flatten().tolist())) > 10  # not one token repeated
    # the task's chains: after a trigger token the next token copies the one before it
    triggers = set(BigramBackcopy().triggers.tolist())
    pairs = [(r[t - 1], r[t + 1]) for r in body.tolist() for t in range(1, 15) if r[t] in triggers]
    assert pairs and all(a == b for a, b in pairs)
    bos = make_prompts(organism, "natural", "bos", n=6, seq_len=16, seed=1).tokens
    assert (bos[:, 0] == 64).all() and torch.equal(bos[:, 1:], body[:, :-1])


def test_task_of_tokenizer_is_none_for_real_tokenizers(gpt2_tiny):
    from mechsink.inputs.tasks import task_of_tokenizer

    assert task_of_tokenizer(gpt2_tiny.tokenizer) is None


def test_a_suite_of_one_repeated_token_is_refused(gpt2_tiny, monkeypatch):
    from mechsink.inputs import corpus

    with pytest.raises(BadInputError, match=r"every token of the custom suite is id \d+ \(' a'\)"):
        prompts_from_texts(gpt2_tiny, [" a" * 20, " a" * 30], "bos", seq_len=8)
    docs = [corpus.Document("news", f"d{i}", " a" * 200) for i in range(8)]
    monkeypatch.setattr(corpus, "natural_documents", lambda: docs)
    with pytest.raises(BadInputError, match="every token of the natural suite"):
        make_prompts(gpt2_tiny, "natural", "bos", n=4, seq_len=8)
    rep = make_prompts(gpt2_tiny, "repeated", "nobos", n=2, seq_len=8)  # by design: allowed
    assert len(set(rep.tokens[0].tolist())) == 1
