"""The pages: ``docs/`` copied into a staging folder, every Markdown file rendered as a Jinja
template from the results, figures and assets written beside them, a page per gallery model and
per executed notebook."""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docs.build.cache import Cache, slug
from docs.build.notebooks import notebook_markdown
from docs.build.plan import DOCS, ROOT, Plan
from docs.build.tables import helpers
from mechsink.errors import MissingDependencyError
from mechsink.io import atomic_write_json, atomic_write_text


@dataclass
class Site:
    """Everything the pages are rendered from."""

    plan: Plan
    census: dict[str, dict[str, Any]]
    gallery: dict[str, dict[str, Any]]
    circuits: dict[str, dict[str, Any]]
    snippets: dict[str, dict[str, Any]]
    notebooks: dict[str, Path]
    cache: Cache | None = None  # figures are cached too when given
    findings: dict[str, dict[str, Any]] | None = None  # name -> {folder, model, settings}


def _copy_sources(dst: Path) -> list[Path]:
    """Copy ``docs/`` into ``dst`` (without build outputs and private folders); the .md files."""
    def ignore(folder: str, names: list[str]) -> list[str]:
        top = Path(folder) == DOCS
        return [n for n in names if (top and (n.startswith("_") or n == "build"))
                or n == "__pycache__"
                or n.startswith(".ipynb_checkpoints")]

    shutil.copytree(DOCS, dst, ignore=ignore, dirs_exist_ok=True)
    return sorted(dst.rglob("*.md"))


def write_assets(site: Site, src: Path) -> None:
    """Figures (from the JSON), circuits figures, snippet outputs and circuitsvis's JavaScript."""
    from mechsink.viz.attention import circuitsvis_js
    from mechsink.viz.figures import write_figures

    js = src / "assets" / "js" / "circuitsvis.js"
    js.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(js, circuitsvis_js())
    code = b"".join((ROOT / "mechsink" / "viz" / f).read_bytes()
                    for f in ("figures.py", "style.py"))
    for model, data in site.census.items():
        folder = src / "assets" / slug(model)
        folder.mkdir(parents=True, exist_ok=True)
        if site.cache is None:
            write_figures(data, folder)
        else:  # drawn once per (census, figure code)
            key = {"census": hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest(),
                   "code": hashlib.sha256(code).hexdigest()}
            drawn = site.cache.get("figures", model, key,
                                   lambda out, data=data: write_figures(data, out) and None)
            for f in drawn.glob("*.png"):
                shutil.copy2(f, folder / f.name)
        atomic_write_json(folder / "census.json", data, sort_keys=True)
    for name, c in site.circuits.items():
        folder = src / "assets" / "circuits" / name
        folder.mkdir(parents=True, exist_ok=True)
        for f in c["folder"].iterdir():  # summary.md is part of the tutorial page
            if f.suffix in (".png", ".json") and f.name != "settings.json":
                shutil.copy2(f, folder / f.name)
    for name, s in site.snippets.items():
        folder = src / "assets" / "snippets" / name
        folder.mkdir(parents=True, exist_ok=True)
        for f in s["folder"].iterdir():
            if f.suffix in (".png", ".json") and f.name != "settings.json":
                shutil.copy2(f, folder / f.name)


def write_gallery(site: Site, src: Path, env: Any) -> list[tuple[str, str]]:
    """One page per gallery model from ``docs/_templates/gallery_model.md``; (title, path)."""
    from mechsink.viz.gallery import gallery_blocks, inputs_warning

    template = env.from_string((DOCS / "_templates" / "gallery_model.md").read_text("utf-8"))
    pages = []
    for i, (model, data) in enumerate(site.census.items()):
        rel = f"gallery/{slug(model)}.md"
        text = template.render(model=model, data=data, s=slug(model), assets="../assets",
                               attention=gallery_blocks(site.gallery[model], prefix=f"cv{i}"),
                               gallery=site.gallery[model], inputs_warning=inputs_warning,
                               **helpers())
        atomic_write_text(src / rel, text)
        pages.append((model, rel))
    return pages


def write_notebook_pages(site: Site, src: Path) -> None:
    import nbformat

    for name, folder in site.notebooks.items():
        nb = nbformat.read(folder / "executed.ipynb", as_version=4)
        page = src / "notebooks" / f"{name}.md"
        body = notebook_markdown(nb, src / "notebooks" / f"{name}_files", f"{name}_files")
        header = (f"[Download the notebook]({name}.ipynb) · executed on `{site.plan.main}` for "
                  f"this page ([executed copy]({name}.executed.ipynb)). Change `MODEL` in the "
                  "first code cell to adapt it.\n\n")
        title, sep, rest = body.partition("\n")
        text = (f"{title}\n\n{header}{rest}" if title.startswith("# ") and sep
                else header + body)
        atomic_write_text(page, f"<!-- generated from docs/notebooks/{name}.ipynb -->\n{text}")
        shutil.copy2(folder / "executed.ipynb", src / "notebooks" / f"{name}.executed.ipynb")


def write_findings(site: Site, src: Path) -> list[tuple[str, str]]:
    """A page per finding and the cross-model page (docs/build/findings.py); (title, path)."""
    from docs.build.findings import (
        FINDINGS,
        cross_model_page,
        finding_page,
        index_page,
        verdict_rows,
    )
    from mechsink.viz.gallery import flagged_runs

    folder = src / "findings"
    folder.mkdir(parents=True, exist_ok=True)
    nav, entries = [], []
    for f in FINDINGS:
        got = (site.findings or {}).get(f.name)
        if got is None:
            continue
        module = importlib.import_module(f"mechsink.experiments.{f.name}")
        result_file = getattr(module, "RESULT_FILE", "result.json")
        result = json.loads((got["folder"] / result_file).read_text("utf-8"))
        assets = src / "assets" / "findings" / f.name
        assets.mkdir(parents=True, exist_ok=True)
        key = getattr(module, "FIGURE", None)
        figures = sorted((p.name for p in got["folder"].glob("*.png")),
                         key=lambda n: (n != key, n))
        for name in [*figures, result_file]:
            shutil.copy2(got["folder"] / name, assets / name)
        page = finding_page(f, result, (got["folder"] / "summary.md").read_text("utf-8"),
                            figures, got["model"], got["settings"],
                            f"../assets/findings/{f.name}", result_file)
        atomic_write_text(folder / f"{f.slug}.md", page)
        nav.append((f.title, f"findings/{f.slug}.md"))
        entries.append((f, verdict_rows(result), got["model"]))
    if not entries:
        return []
    flagged = {m: flagged_runs(g) for m, g in site.gallery.items()}
    atomic_write_text(folder / "cross-model.md", cross_model_page(site.census, flagged=flagged))
    atomic_write_text(folder / "index.md", index_page(entries))
    return [*nav, ("Across models: the first token", "findings/cross-model.md")]


def render_pages(site: Site, src: Path) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Copy and render every page into ``src``; returns the gallery and finding pages for the
    nav."""
    try:
        import jinja2
    except ImportError as exc:  # pragma: no cover - jinja2 comes with mkdocs
        raise MissingDependencyError("the docs build needs jinja2 (pip install -e '.[docs]')") \
            from exc
    from mechsink.viz.gallery import gallery_blocks

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    pages = _copy_sources(src)
    write_assets(site, src)
    main = site.plan.main
    context = {
        "plan": site.plan, "main": main, "main_slug": slug(main), "census": site.census,
        "main_census": site.census.get(main) or next(iter(site.census.values())),
        "circuits": site.circuits, "snippets": site.snippets,
        "gallery_models": list(site.census), "notebooks": list(site.notebooks),
        "main_attention": gallery_blocks(site.gallery[main], prefix="cvmain")
        if main in site.gallery else "",
        **helpers(),
    }
    for page in pages:
        depth = len(page.relative_to(src).parts) - 1
        text = page.read_text(encoding="utf-8")
        try:
            rendered = env.from_string(text).render(assets="../" * depth + "assets", **context)
        except jinja2.TemplateError as exc:
            raise RuntimeError(f"{page.relative_to(src)}: {exc}") from exc
        atomic_write_text(page, rendered)
    gallery = write_gallery(site, src, env)
    findings = write_findings(site, src)
    if site.notebooks:
        write_notebook_pages(site, src)
    if site.plan.name == "quick":
        for page in sorted(src.rglob("*.md")):
            if page.relative_to(src).parts[0] not in NO_BANNER:
                atomic_write_text(page, with_banner(page.read_text(encoding="utf-8"), site.plan))
    return gallery, findings


NO_BANNER = ("api", "census-schema.md")  # pages that show no result


def quick_banner(plan: Plan) -> str:
    """The admonition every result page of a quick build opens with."""
    models = ", ".join(f"`{m}`" for m in plan.scans)
    return (f'!!! warning quick-build "Quick build: tiny untrained models"\n'
            f"    This site was built with `MECHSINK_DOCS_QUICK=1`: the numbers, figures and "
            f"tables on this page come from {models} (random-init or tiny toy models) with a few "
            f"short prompts. They show what the page looks like, not what trained models do; "
            f"`make docs` builds it from the real models.\n\n")


def with_banner(text: str, plan: Plan) -> str:
    """``text`` with the quick-build banner after its ``# title`` (or at the top)."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("# "):
            return "\n".join([*lines[: i + 1], "", quick_banner(plan), *lines[i + 1:]])
    return quick_banner(plan) + text
