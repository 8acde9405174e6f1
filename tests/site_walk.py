"""Walk a built docs site as a reader opening it from ``file://`` does: headless Chromium (the
system's, driven by Playwright) opens every page, clicks its links, and records JavaScript
errors, network requests (anything not ``file:``, ``data:`` or ``blob:``), dead same-page anchors,
raw Sphinx roles in the rendered text, and clicks that land on a folder listing instead of a page.

Used by ``tests/test_browser.py`` and ``python -m docs.build.check --browser``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
OK_SCHEMES = ("file:", "data:", "blob:", "about:")

# Run in every page: same-page anchors whose id is missing, raw roles in the visible text, and
# the page's internal links (to click).
_INSPECT = r"""() => {
  const dead = [...document.querySelectorAll('a[href^="#"]')]
    .map(a => decodeURIComponent(a.getAttribute('href').slice(1)))
    .filter(id => id && !document.getElementById(id) && !document.getElementsByName(id).length);
  const text = document.body ? document.body.innerText : '';
  const role = /:(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const|ref|doc):\S{0,30}/g;
  const roles = text.match(role) || [];
  const links = [...document.querySelectorAll('a[href]')]
    .map(a => a.href).filter(h => h.startsWith('file:'));
  return {dead, roles, links, content: !!document.querySelector('.md-content')};
}"""


def chromium_path() -> str | None:
    """The Chromium to drive: $MECHSINK_CHROMIUM, else ``chromium`` on the PATH."""
    return (os.environ.get("MECHSINK_CHROMIUM") or shutil.which("chromium")
            or shutil.which("chromium-browser"))


@dataclass
class Walk:
    """What the walk met (each entry names the page)."""

    pages: list[str] = field(default_factory=list)
    clicks: int = 0
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dead_anchors: list[str] = field(default_factory=list)
    raw_roles: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {"pages": len(self.pages), "clicks": self.clicks, "JS errors": len(self.errors),
                "network requests": len(self.requests),
                "dead anchors": len(self.dead_anchors), "raw Sphinx roles": len(self.raw_roles),
                "links to folders": len(self.folders), "missing targets": len(self.missing)}


def _landed_on_page(url: str) -> bool:
    path = unquote(url.split("#", 1)[0].split("?", 1)[0])
    return path.endswith(".html") and Path(path.removeprefix("file://")).is_file()


def walk(site: Path, *, clicks_per_page: int = 4, browser=None) -> Walk:
    """Open every ``*.html`` under ``site`` from ``file://`` and click up to ``clicks_per_page``
    of its internal links (the first ones of the page body, then the navigation)."""
    site = Path(site).resolve()
    result = Walk()
    if browser is not None:
        _walk(browser, site, clicks_per_page, result)
        return result
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    if not executable:
        raise RuntimeError("Chromium not found: install it or set MECHSINK_CHROMIUM")
    with tempfile.TemporaryDirectory(prefix="mechsink-chromium-") as profile, \
            sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            _walk(context, site, clicks_per_page, result)
        finally:
            context.close()
    return result


def _walk(context, site: Path, clicks_per_page: int, result: Walk) -> None:
    page = context.new_page()
    where = {"page": ""}
    page.on("console", lambda m: result.errors.append(f"{where['page']}: console: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: result.errors.append(f"{where['page']}: {e}"))
    page.on("request", lambda r: None if r.url.startswith(OK_SCHEMES)
            else result.requests.append(f"{where['page']}: {r.url}"))
    try:
        for html in sorted(site.rglob("*.html")):
            rel = html.relative_to(site).as_posix()
            where["page"] = rel
            result.pages.append(rel)
            _open(page, html.as_uri())
            seen = page.evaluate(_INSPECT)
            result.dead_anchors += [f"{rel}: #{a}" for a in seen["dead"]]
            result.raw_roles += [f"{rel}: {r}" for r in seen["roles"]]
            if rel != "404.html" and not seen["content"]:
                result.errors.append(f"{rel}: no page content")
            base = html.as_uri()
            targets = []
            for link in seen["links"]:
                if link.split("#")[0] != base and link not in targets:
                    targets.append(link)
            for link in targets[:clicks_per_page]:
                selector = f'a[href]:is([href="{_relative(link, html)}"])'
                anchor = page.locator(selector).first
                result.clicks += 1
                try:
                    if anchor.count() and anchor.is_visible():
                        anchor.click()
                        page.wait_for_load_state("load")
                    else:  # hidden in a collapsed menu: follow it as the keyboard would
                        page.goto(link, wait_until="load")
                except Exception as exc:  # noqa: BLE001 - a link that leads nowhere
                    result.missing.append(f"{rel}: {link}: {str(exc).splitlines()[0]}")
                else:
                    if not _landed_on_page(page.url):
                        result.folders.append(f"{rel}: {link} -> {page.url}")
                _open(page, base)
    finally:
        page.close()


def _open(page, url: str) -> None:
    """Go to ``url``, once more if a failed click's error page interrupted the first try."""
    try:
        page.goto(url, wait_until="load")
    except Exception:  # noqa: BLE001 - "interrupted by another navigation"
        page.wait_for_timeout(200)
        page.goto(url, wait_until="load")


def _relative(link: str, html: Path) -> str:
    """The href attribute a page holds for ``link`` (site links are relative)."""
    target = Path(unquote(link.split("#")[0].removeprefix("file://")))
    rel = os.path.relpath(target, html.parent).replace(os.sep, "/")
    return rel + ("#" + link.split("#", 1)[1] if "#" in link else "")


#: the pages ``python -m docs.build.check --screenshots`` photographs: the home page (the atlas),
#: one finding page, the cross-model page, and a notebook page with an embedded attention view
SCREENSHOT_PAGES = ("index.html", "findings/chain.html", "findings/cross-model.html",
                    "notebooks/researcher_tour.html")

_VIEWS = r"""() => [...document.querySelectorAll('.mechsink-cv')].map(e => ({
  elements: e.querySelectorAll('*').length, height: e.getBoundingClientRect().height}))"""


def screenshots(site: Path, out: Path, pages: tuple[str, ...] = SCREENSHOT_PAGES,
                width: int = 1280) -> dict[str, dict]:
    """Full-page PNGs of ``pages`` (opened from ``file://``) into ``out``; per page its file, the
    page height and its attention views (elements drawn, height): a view that drew nothing has
    no elements."""
    from playwright.sync_api import sync_playwright

    site, out = Path(site).resolve(), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    executable = chromium_path()
    if not executable:
        raise RuntimeError("Chromium not found: install it or set MECHSINK_CHROMIUM")
    shots: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mechsink-chromium-") as profile, \
            sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=executable, headless=True, args=CHROMIUM_ARGS,
            viewport={"width": width, "height": 900})
        try:
            for rel in pages:
                if not (site / rel).is_file():
                    continue
                page = context.new_page()
                page.goto((site / rel).as_uri(), wait_until="load")
                page.wait_for_timeout(1500)  # circuitsvis draws after load
                png = out / (rel.removesuffix(".html").replace("/", "-") + ".png")
                page.screenshot(path=str(png), full_page=True)
                shots[rel] = {"file": str(png), "height": page.evaluate(
                    "() => document.documentElement.scrollHeight"),
                    "views": page.evaluate(_VIEWS)}
                page.close()
        finally:
            context.close()
    return shots
