"""The built docs site in a real browser, opened from ``file://`` as the README says: headless
Chromium (Debian's ``chromium``, driven by Playwright, a fresh profile) walks every page
(``tests/site_walk.py``: clicks links, fails on a JavaScript error, a dead anchor, a raw Sphinx
role, a click that lands on a folder, a network request), checks that the circuitsvis
attention views render, that images load and that search works offline. Screenshots go to the
test's temporary folder (their paths are printed; ``pytest -s`` shows them).

The site is built in quick mode (tiny models, about a minute on two cores). When Chromium or
Playwright is missing the test is skipped and says how to install them (``.ci/run`` installs
Chromium; Playwright comes with ``pip install -e '.[dev]'``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import site_walk  # noqa: E402

from docs.build.check import scan  # noqa: E402

pytestmark = pytest.mark.slow


def chromium_path() -> str:
    path = site_walk.chromium_path()
    if not path:
        pytest.skip("Chromium not found: install Debian's package (apt-get install -y chromium) "
                    "or set MECHSINK_CHROMIUM to a Chromium executable.")
    return path


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from docs.build import QUICK, build

    root = tmp_path_factory.mktemp("docs")
    return build(QUICK, site_dir=root / "site", cache_dir=root / "cache", work_dir=root / "work")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):
    sync_api = pytest.importorskip(
        "playwright.sync_api",
        reason="Playwright is not installed: pip install -e '.[dev]' (it drives the system "
               "Chromium; no browser download is needed)")
    executable = chromium_path()
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as p:
        try:
            context = p.chromium.launch_persistent_context(
                str(profile), executable_path=executable, headless=True,
                args=site_walk.CHROMIUM_ARGS, viewport={"width": 1280, "height": 900})
        except Exception as exc:  # a Chromium that cannot start here is an environment problem
            pytest.skip(f"Chromium at {executable} does not start: {exc}")
        yield context
        context.close()


def visit(browser, url: str, shot: Path) -> dict:
    """Open ``url``; record requests and console errors; wait for the attention views."""
    page = browser.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(url, wait_until="load")
    views = page.locator(".mechsink-cv")
    count = views.count()
    page.wait_for_function(
        "() => [...document.querySelectorAll('.mechsink-cv')]"
        ".every(e => e.children.length > 0 && e.getBoundingClientRect().height > 50)",
        timeout=20_000)
    boxes = [views.nth(i).bounding_box() for i in range(count)]
    inner = page.evaluate(
        "() => [...document.querySelectorAll('.mechsink-cv')].map(e => e.querySelectorAll("
        "'*').length)")
    page.wait_for_timeout(300)  # let the canvases paint before the screenshot
    page.screenshot(path=str(shot), full_page=True)
    views.first.screenshot(path=str(shot.with_name(shot.stem + "-view.png")))
    page.close()
    offsite = [u for u in requests if not u.startswith(site_walk.OK_SCHEMES)]
    return {"count": count, "boxes": boxes, "inner": inner, "requests": requests,
            "offsite": offsite, "errors": errors}


def test_walking_every_page_from_file_finds_nothing_broken(browser, site: Path) -> None:
    """Every page from file://, a few links clicked on each: the five counts are 0."""
    static = scan(site)
    assert static.pages > 15
    for page in ("findings/index", "findings/chain", "findings/cross-model",
                 "findings/headwise-rmsnorm", "findings/sink-free"):
        assert (site / f"{page}.html").is_file(), page
    assert static.counts() == dict.fromkeys(static.counts(), 0), {
        k: v[:5] for k, v in static.problems.items()}
    walk = site_walk.walk(site, clicks_per_page=2, browser=browser)
    print(f"\nwalked {len(walk.pages)} pages, {walk.clicks} clicks")
    assert len(walk.pages) == static.pages and walk.clicks > 30
    problems = {k: getattr(walk, k)[:5] for k in ("errors", "requests", "dead_anchors",
                                                  "raw_roles", "folders", "missing")}
    assert not any(problems.values()), problems


@pytest.mark.parametrize("page_path", ["gallery/random-llama-tiny.html", "tutorials/scan.html",
                                       "notebooks/researcher_tour.html"])
def test_attention_views_render_offline(browser, site: Path, page_path: str,
                                        tmp_path: Path) -> None:
    assert (site / page_path).is_file()
    assert 'class="admonition warning quick-build"' in (site / page_path).read_text("utf-8")
    shot = tmp_path / (page_path.removesuffix(".html").replace("/", "-") + ".png")
    seen = visit(browser, (site / page_path).as_uri(), shot)
    print(f"\nscreenshots: {shot} and {shot.with_name(shot.stem + '-view.png')}")

    assert seen["count"] == 2, "expected two attention views (sink and ordinary heads)"
    legends = (site / page_path).read_text("utf-8").count('class="mechsink-cv-legend"')
    assert legends == 2, "every attention view has its colour legend"
    for box, n_elements in zip(seen["boxes"], seen["inner"], strict=True):
        assert box is not None and box["width"] > 100 and box["height"] > 50
        assert n_elements > 10, "circuitsvis rendered (almost) nothing"
    assert any(u.endswith("/assets/js/circuitsvis.js") for u in seen["requests"])
    assert seen["offsite"] == [], f"requests left the file system: {seen['offsite']}"
    assert seen["errors"] == [], seen["errors"]
    assert shot.stat().st_size > 10_000


def test_every_page_is_offline(site: Path) -> None:
    """No built page loads a script, stylesheet, font or image from another host."""
    import re

    remote = re.compile(r"""<(?:script|img|iframe|link)\b[^>]*\b(?:src|href)\s*=\s*["']?"""
                        r"""(?:https?:)?//""", re.I)
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 15
    for page in pages:
        text = page.read_text(encoding="utf-8")
        hits = [m.group(0) for m in remote.finditer(text)]
        # <link rel="canonical"> etc. are not loads; only stylesheets/icons/preloads would be
        hits = [h for h in hits if not h.lower().startswith("<link")
                or re.search(r"stylesheet|icon|preload|prefetch", h, re.I)]
        assert hits == [], f"{page.relative_to(site)} loads from the internet: {hits}"
    for css in site.rglob("*.css"):
        assert not re.search(r"url\(\s*['\"]?(?:https?:)?//", css.read_text("utf-8")), css


@pytest.mark.parametrize("page_path", ["index.html", "notebooks/patching_walkthrough.html",
                                       "concepts/sink-score.html", "api/patching.html"])
def test_pages_load_their_figures_offline(browser, site: Path, page_path: str) -> None:
    """Every image on the page loads, from the site's files only, with no console error."""
    page = browser.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((site / page_path).as_uri(), wait_until="load")
    broken = page.evaluate("() => [...document.images].filter(i => !i.complete || "
                           "i.naturalWidth === 0).map(i => i.src)")
    n_images = page.evaluate("() => document.images.length")
    page.close()
    assert broken == []
    if page_path.startswith(("notebooks", "concepts")):
        assert n_images >= 1
    offsite = [u for u in requests if not u.startswith(site_walk.OK_SCHEMES)]
    assert offsite == [] and errors == []


def test_search_works_offline_from_file(browser, site: Path) -> None:
    """Material's search runs from file:// (search_index.js and a blob: worker, no network)
    and its first result opens a page."""
    page = browser.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(f"{m.type}: {m.text}"))
    page.goto((site / "concepts" / "sink-score.html").as_uri(), wait_until="load")
    box = page.locator("input.md-search__input")
    box.click()
    page.wait_for_function(  # the worker has built its index: "Initializing search" is gone
        "() => { const m = document.querySelector('.md-search-result__meta');"
        " return m && m.textContent.trim() && !/initializ/i.test(m.textContent); }",
        timeout=60_000)
    box.press_sequentially("sink rate", delay=30)
    try:
        page.wait_for_selector(".md-search-result__item", timeout=30_000)
    except Exception:
        meta = page.locator(".md-search-result__meta").all_inner_texts()
        value = page.locator("input.md-search__input").input_value()
        page.close()
        pytest.fail(f"no search result for {value!r}; meta {meta}; console {errors}; "
                    f"requests {requests}")
    hits = page.locator(".md-search-result__item").count()
    page.locator(".md-search-result__item a").first.click()
    page.wait_for_load_state("load")
    landed = page.url
    page.close()
    assert hits > 0
    assert landed.split("#")[0].endswith(".html"), landed
    assert all(u.startswith(site_walk.OK_SCHEMES) for u in requests), requests
    assert [e for e in errors if e.startswith("error")] == [], errors
