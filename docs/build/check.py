"""`python -m docs.build.check [SITE] [--browser]`: what a reader opening the built site from
``file://`` would trip over, counted (the goal is 0 everywhere).

Static counts, from the HTML files alone: links to folders (a folder listing, not a page, from
``file://``), missing targets (a link, image, script or stylesheet whose file is not in the site),
dead anchors (``#id`` not on the target page), raw Sphinx roles (``:func:`` shown as text) and
content tables without a caption (a "Table: ..." paragraph right before it; API pages aside).
``--browser`` adds what only a browser sees (``tests/site_walk.py``, headless Chromium from
``file://``): JavaScript errors and network requests.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from docs.build.plan import DOCS, ROOT

RAW_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const|ref|doc):(?=\S)")
LINK_ATTRS = {("a", "href"), ("img", "src"), ("script", "src"), ("link", "href"),
              ("source", "src"), ("iframe", "src")}


BLOCKS = {"h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "pre", "table", "blockquote",
          "summary", "figure", "img"}
NO_CAPTION_CHECK = ("api/",)  # generated reference: its tables are parameter lists


class _Page(HTMLParser):
    """The ids, the outgoing references and the visible text of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.refs: list[tuple[str, str]] = []  # (tag, url)
        self.text: list[str] = []
        self._hidden = 0
        self.uncaptioned: list[str] = []  # tables whose preceding block is no "Table: ..." line
        self._p: list[str] | None = None  # the text of the paragraph being read
        self._last: tuple[str, str] = ("", "")  # the last block closed: (tag, text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("id", "name") and value and not (tag == "meta" or tag == "input"):
                self.ids.add(value)
            if (tag, name) in LINK_ATTRS and value is not None:
                if tag == "link" and not any(k == "rel" and v and re.search(
                        r"stylesheet|icon|preload|prefetch", v) for k, v in attrs):
                    continue  # <link rel="canonical"> etc. load nothing
                self.refs.append((tag, value))
        if tag in ("script", "style"):
            self._hidden += 1
        if tag == "p":
            self._p = []
        elif tag == "table" and not dict(attrs).get("class"):  # a content table (not code's)
            kind, text = self._last
            if not (kind == "p" and text.strip().startswith("Table")):
                self.uncaptioned.append(f"after <{kind or '-'}> {text.strip()[:60]!r}")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._hidden:
            self._hidden -= 1
        if tag == "p" and self._p is not None:
            self._last, self._p = ("p", "".join(self._p)), None
        elif tag in BLOCKS:
            self._last = (tag, "")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.text.append(data)
            if self._p is not None:
                self._p.append(data)


@dataclass
class Report:
    """The counts and, for each, up to a few examples (page: what)."""

    pages: int = 0
    links: int = 0
    problems: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))

    def counts(self) -> dict[str, int]:
        keys = ("links to folders", "missing targets", "dead anchors", "raw Sphinx roles",
                "tables without a caption")
        return {k: len(self.problems.get(k, [])) for k in keys}


def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8", errors="replace"))
    page.close()
    return page


def scan(site: Path) -> Report:
    """Count the static problems of every HTML page under ``site``."""
    site = Path(site).resolve()
    files = sorted(site.rglob("*.html"))
    parsed = {f: _parse(f) for f in files}
    report = Report(pages=len(files))
    for f, page in parsed.items():
        rel = f.relative_to(site).as_posix()
        text = "".join(page.text)
        if not rel.startswith(NO_CAPTION_CHECK):
            report.problems["tables without a caption"] += [f"{rel}: {t}"
                                                            for t in page.uncaptioned]
        for m in RAW_ROLE.finditer(text):
            report.problems["raw Sphinx roles"].append(f"{rel}: {text[m.start():m.end() + 30]!r}")
        for tag, url in page.refs:
            parts = urlsplit(url)
            if parts.scheme or parts.netloc or url.startswith(("data:", "blob:", "javascript:")):
                continue  # external links are the offline test's business, not navigation's
            report.links += 1
            if parts.path.startswith("/"):
                report.problems["missing targets"].append(f"{rel}: root-absolute {url}")
                continue
            target = (f.parent / unquote(parts.path)).resolve() if parts.path else f
            if target.is_dir() or (parts.path.endswith("/") and parts.path):
                report.problems["links to folders"].append(f"{rel}: {url}")
                continue
            if not target.exists():
                report.problems["missing targets"].append(f"{rel}: {url}")
                continue
            if tag == "a" and parts.fragment and target.suffix == ".html":
                anchor = unquote(parts.fragment)
                other = parsed.get(target) or _parse(target)
                if anchor not in other.ids:
                    report.problems["dead anchors"].append(f"{rel}: {url}")
    return report


def _site_walk():
    spec = importlib.util.spec_from_file_location("site_walk", ROOT / "tests" / "site_walk.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules["site_walk"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m docs.build.check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("site", nargs="?", type=Path, default=DOCS / "_site")
    parser.add_argument("--browser", action="store_true",
                        help="also walk every page in headless Chromium (JS errors, requests)")
    parser.add_argument("--screenshots", nargs="?", type=Path, const=DOCS / "_build" /
                        "screenshots", default=None, metavar="DIR",
                        help="also photograph the home page, a finding page, the cross-model "
                             "page and a notebook page into DIR (docs/_build/screenshots)")
    parser.add_argument("--examples", type=int, default=3, help="examples shown per count")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        parser.error(f"{args.site} has no index.html: build the site first (make docs)")
    report = scan(args.site)
    counts = report.counts()
    if args.browser:
        walk = _site_walk().walk(args.site)
        counts["JS errors"] = len(walk.errors)
        counts["network requests"] = len(walk.requests)
        counts["links to folders"] += len(walk.folders)  # clicks that landed on a folder
        report.problems["links to folders"] += walk.folders
        report.problems["missing targets"] += walk.missing
        counts["missing targets"] += len(walk.missing)
        report.problems["JS errors"] = walk.errors
        report.problems["network requests"] = walk.requests
    if args.screenshots is not None:
        for rel, shot in _site_walk().screenshots(args.site, args.screenshots).items():
            views = ", ".join(f"{v['elements']} elements" for v in shot["views"]) or "none"
            print(f"screenshot {shot['file']} ({rel}, {shot['height']} px tall; attention "
                  f"views: {views})")
    if args.json:
        print(json.dumps({"pages": report.pages, "links": report.links, **counts}))
    else:
        print(f"{report.pages} pages, {report.links} internal links/loads")
        for key, n in counts.items():
            print(f"{key}: {n}")
            for example in report.problems.get(key, [])[: args.examples]:
                print(f"    {example}")
    return 0 if not any(counts.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
