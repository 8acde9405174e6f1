"""Real English text for the `natural` input suite, taken from the gensim 4.4.0 wheel.

Two files ship in that wheel's test data: ``lee_background.cor`` (300 news articles, one per
line) and a 6 MB Wikipedia extract (bz2 XML). :func:`natural_documents` returns plain-text
documents from both, wiki markup stripped, in a fixed order. gensim itself is never installed:
:mod:`mechsink.model.assets` takes the two files out of the wheel and checks their sha256.
"""

from __future__ import annotations

import bz2
import html
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from functools import lru_cache

from mechsink.errors import BadInputError
from mechsink.model import assets
from mechsink.model.assets import Asset

LEE_NEWS = Asset(
    "gensim", "4.4.0", "gensim/test/test_data/lee_background.cor",
    "5d78d6dafd953bbf65797bef09a9ffb9ec430583381be705f8fd460000f370fb",
)
WIKI_EXTRACT = Asset(
    "gensim", "4.4.0",
    "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
    "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d",
)

MIN_PARAGRAPH_CHARS = 200  # shorter wiki paragraphs are mostly captions, lists or leftovers
# len(natural_documents()): the files are pinned by sha256, so the count is too (a test
# recounts it); known without parsing 6 MB of XML, so a request can be checked before any work
NATURAL_TEXTS = 4428


def check_corpus_size(n: int, option: str = "--n") -> None:
    """``n`` natural texts are at most what the corpus holds (fewer are long enough for a
    long ``seq_len``: the prompts say so once they are tokenised)."""
    if n > NATURAL_TEXTS:
        raise BadInputError(
            f"{option} {n} is more than the natural corpus holds ({NATURAL_TEXTS} texts, fewer "
            f"of them long enough for long sequences): give {option} {NATURAL_TEXTS} or less, "
            "or use the random or repeated suite.")


@dataclass(frozen=True)
class Document:
    """One plain-text document: its source ("news" or "wiki"), a title and the text."""

    source: str
    title: str
    text: str


@lru_cache(maxsize=1)
def natural_documents() -> tuple[Document, ...]:
    """All news articles, then every wiki paragraph of at least ``MIN_PARAGRAPH_CHARS`` chars."""
    news = assets.fetch(LEE_NEWS).read_text(encoding="utf-8").splitlines()
    docs = [Document("news", f"lee_background:{i}", line.strip())
            for i, line in enumerate(news) if line.strip()]
    for title, wikitext in _wiki_pages(assets.fetch(WIKI_EXTRACT).read_bytes()):
        for j, para in enumerate(wiki_paragraphs(wikitext)):
            docs.append(Document("wiki", f"{title}#{j}", para))
    return tuple(docs)


def _wiki_pages(compressed: bytes) -> list[tuple[str, str]]:
    """(title, wikitext) of every article page (namespace 0) that is not a redirect."""
    root = ET.fromstring(bz2.decompress(compressed))
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    pages = []
    for page in root.iter(f"{ns}page"):
        if page.findtext(f"{ns}ns") != "0" or page.find(f"{ns}redirect") is not None:
            continue
        text = page.findtext(f"{ns}revision/{ns}text") or ""
        pages.append((page.findtext(f"{ns}title") or "", text))
    return pages


_COMMENT = re.compile(r"<!--.*?-->", re.S)
_REF = re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.S | re.I)
_TAG = re.compile(r"<[^>]+>")
_FILE_LINK = re.compile(
    r"\[\[(?:File|Image|Category|[a-z\-]{2,12}):[^\[\]]*(?:\[\[[^\]]*\]\][^\[\]]*)*\]\]", re.I
)
_LINK = re.compile(r"\[\[(?:[^\[\]|]*\|)?([^\[\]]*)\]\]")
_EXT_LINK = re.compile(r"\[https?://[^\s\]]+\s*([^\]]*)\]")
_BARE_URL = re.compile(r"https?://\S+")
_EMPHASIS = re.compile(r"'{2,}")
_HEADING = re.compile(r"^=+.*=+\s*$", re.M)
_MARKUP_LINE = re.compile(r"^\s*[*#:;|!{}]")


_BRACE = re.compile(r"\{\{|\{\||\}\}|\|\}")


def strip_templates(text: str) -> str:
    """Remove ``{{...}}`` templates and ``{|...|}`` tables, nested ones included."""
    out, depth, start = [], 0, 0
    for m in _BRACE.finditer(text):
        opening = m.group()[0] == "{"
        if opening:
            if depth == 0:
                out.append(text[start:m.start()])
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                start = m.end()
    if depth == 0:
        out.append(text[start:])
    return "".join(out)


def wiki_paragraphs(wikitext: str) -> list[str]:
    """Plain-text paragraphs of a wiki article: markup, templates, refs, lists, tables removed."""
    text = _COMMENT.sub("", wikitext)
    text = _REF.sub("", text)
    text = strip_templates(text)
    text = _FILE_LINK.sub("", text)
    text = _LINK.sub(r"\1", text)
    text = _EXT_LINK.sub(r"\1", text)
    text = _BARE_URL.sub("", text)
    text = _TAG.sub("", text)
    text = _EMPHASIS.sub("", text)
    text = _HEADING.sub("", text)
    text = html.unescape(text).replace("\u00a0", " ")
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        lines = [ln for ln in block.splitlines() if ln.strip() and not _MARKUP_LINE.match(ln)]
        para = re.sub(r"\s+", " ", " ".join(lines)).strip()
        para = re.sub(r"\(\s*[,;]?\s*\)", "", para).replace(" ,", ",").replace(" .", ".")
        if len(para) >= MIN_PARAGRAPH_CHARS and "[[" not in para and "]]" not in para:
            paragraphs.append(para)
    return paragraphs
