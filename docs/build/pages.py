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
from docs.build.tables import caption_tables, helpers
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
    atlas: Any = None  # a committed atlas (docs.build.results.CommittedAtlas) or None

    def results_root(self) -> Path:
        """Where the committed results are read: beside the atlas the site was given, else
        ``docs/results``."""
        from docs.build.results import RESULTS

        return RESULTS if self.atlas is None else self.atlas.root.parent

    def committed_pages(self) -> set[str]:
        """The pages drawn from committed real-model results (no quick-build banner)."""
        pages = {"weight_quantization": ("weight-quantization",),
                 **{folder: tuple(p[0] for p in entries)
                    for folder, entries in COMMITTED_PAGES.items()}}
        own = {f"findings/{page}.md" for folder, names in pages.items() for page in names
               if any((self.results_root() / folder).glob("*.json"))}
        if self.atlas is None:
            return own
        from docs.build.atlas_pages import step_rows
        from docs.build.findings import BY_NAME
        from docs.build.results import ATLAS_STEPS

        return own | {"index.md", "findings/cross-model.md",
                      *(f"findings/{BY_NAME[s].slug}.md" for s in ATLAS_STEPS
                        if step_rows(self.atlas, s))}


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


def figure_code(name: str) -> str:
    """sha256 of what draws an experiment's figure: its module and every mechsink/viz file."""
    module = importlib.import_module(f"mechsink.experiments.{name}")
    files = [Path(module.__file__), *sorted((ROOT / "mechsink" / "viz").glob("*.py"))]
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()


def draw_result(site: Site, name: str, folder: Path, tag: str, dest: Path) -> list[str]:
    """Copy experiment ``name``'s result JSON from ``folder`` into ``dest`` and draw its figure
    there from that JSON (cached per result and figure code); the figure names."""
    from mechsink.experiments.result import ExperimentResult

    module = importlib.import_module(f"mechsink.experiments.{name}")
    result_file = getattr(module, "RESULT_FILE", "result.json")
    figure = getattr(module, "FIGURE", None)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(folder / result_file, dest / result_file)
    if not figure:
        return []

    def produce(out: Path) -> None:
        ExperimentResult.load(folder, name).figure(out / figure)

    if site.cache is None:
        produce(dest)
    else:
        key = {"result": hashlib.sha256((folder / result_file).read_bytes()).hexdigest(),
               "code": figure_code(name)}
        drawn = site.cache.get(f"figure-{name}", tag, key, produce)
        for f in drawn.glob("*.png"):
            shutil.copy2(f, dest / f.name)
    return [figure] if (dest / figure).is_file() else []


def write_atlas_findings(site: Site, src: Path) -> list[tuple[Any, list[dict[str, str]], str]]:
    """The finding pages the committed atlas feeds (a section per model); (finding, verdict
    rows of its first model, models) per page written."""
    from docs.build.atlas_pages import absent_rows, anchor, provenance, step_rows
    from docs.build.findings import BY_NAME, Section, multi_model_page, verdict_rows
    from docs.build.results import ATLAS_STEPS

    atlas, out = site.atlas, []
    for step in ATLAS_STEPS:
        rows = step_rows(atlas, step)
        if not rows:
            continue
        f, sections = BY_NAME[step], []
        for row, folder in rows:
            dest = src / "assets" / "results" / atlas.name / row["folder"] / step
            figures = draw_result(site, step, folder, f"atlas-{row['model']}", dest)
            result = json.loads((folder / "result.json").read_text("utf-8"))
            module = importlib.import_module(f"mechsink.experiments.{step}")
            sections.append(Section(row["model"], anchor(row["model"]), result,
                                    module.summary(result), figures,
                                    f"../assets/results/{atlas.name}/{row['folder']}/{step}"))
        page = multi_model_page(f, sections, atlas.entry.get("command") or "-",
                                provenance(atlas), absent_rows(atlas, step))
        atomic_write_text(src / "findings" / f"{f.slug}.md", page)
        out.append((f, verdict_rows(sections[0].result),
                    ", ".join(f"`{s.model}`" for s in sections)))
    return out


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
    from_atlas = {f.name: (f, rows, models) for f, rows, models in (
        write_atlas_findings(site, src) if site.atlas is not None else [])}
    for f in FINDINGS:
        if f.name in from_atlas:
            nav.append((f.title, f"findings/{f.slug}.md"))
            entries.append(from_atlas[f.name])
            continue
        got = (site.findings or {}).get(f.name)
        if got is None:
            continue
        module = importlib.import_module(f"mechsink.experiments.{f.name}")
        result_file = getattr(module, "RESULT_FILE", "result.json")
        result = json.loads((got["folder"] / result_file).read_text("utf-8"))
        assets = src / "assets" / "findings" / f.name
        figures = draw_result(site, f.name, got["folder"], got["model"] or "trained", assets)
        page = finding_page(f, result, (got["folder"] / "summary.md").read_text("utf-8"),
                            figures, got["model"], got["settings"],
                            f"../assets/findings/{f.name}", result_file)
        atomic_write_text(folder / f"{f.slug}.md", page)
        nav.append((f.title, f"findings/{f.slug}.md"))
        entries.append((f, verdict_rows(result), f"`{got['model']}`" if got["model"] else None))
    if not entries:
        return []
    if site.atlas is not None:
        from docs.build.atlas_pages import cross_model_section

        shutil.copy2(site.atlas.root / "atlas.json", _mkdir(src / "assets" / "results"
                                                             / site.atlas.name) / "atlas.json")
        atomic_write_text(folder / "cross-model.md", cross_model_section(site.atlas))
    else:
        flagged = {m: flagged_runs(g) for m, g in site.gallery.items()}
        atomic_write_text(folder / "cross-model.md",
                          cross_model_page(site.census, flagged=flagged))
    atomic_write_text(folder / "index.md", index_page(entries))
    return [*nav, ("Across models: the first token", "findings/cross-model.md"),
            *write_weight_quantization(site, src), *write_committed_pages(site, src)]


#: pages drawn from committed results beside the atlas: results folder -> (page slug, nav
#: title, the :mod:`docs.build.findings` function that writes it from ``{model: data}``)
COMMITTED_PAGES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "sink_protocol": (("sink-protocol", "Sink rates under Gu et al.'s protocol",
                       "sink_protocol_page"),),
    "census": (("secondary-sinks", "Secondary sinks", "secondary_sinks_page"),
               ("dormant-heads", "Active and dormant sink heads", "dormant_heads_page")),
    "streaming": (("streaming", "Streaming: the kept first tokens", "streaming_page"),),
}


def committed_results(site: Site, folder: str) -> dict[str, Any]:
    """``{model: data}`` of the committed ``docs/results/<folder>/*.json`` (empty: none)."""
    out: dict[str, Any] = {}
    for f in sorted((site.results_root() / folder).glob("*.json")):
        data = json.loads(f.read_text("utf-8"))
        out[str(data.get("model", f.stem))] = data
    return out


def write_committed_pages(site: Site, src: Path) -> list[tuple[str, str]]:
    """Every page of :data:`COMMITTED_PAGES` whose results are committed (its nav entries)."""
    from docs.build import findings

    nav = []
    for folder, pages in COMMITTED_PAGES.items():
        data = committed_results(site, folder)
        if not data:
            continue
        for page, title, writer in pages:
            atomic_write_text(src / "findings" / f"{page}.md", getattr(findings, writer)(data))
            nav.append((title, f"findings/{page}.md"))
    return nav


def write_weight_quantization(site: Site, src: Path) -> list[tuple[str, str]]:
    """The weight-only int4 page and its figure from the committed results
    (``docs/results/weight_quantization/<model>.json``; none: no page)."""
    from docs.build.findings import weight_quantization_page
    from mechsink.viz.weight_quantization import weight_quantization_figure

    files = sorted((site.results_root() / "weight_quantization").glob("*.json"))
    if not files:
        return []
    data = {f.stem: json.loads(f.read_text("utf-8")) for f in files}
    figure = weight_quantization_figure(
        data, _mkdir(src / "assets" / "findings" / "weight_quantization") / "losses.png")
    page = weight_quantization_page(data) + (
        "\n\n![Loss change per setting and model, with 95% intervals over prompts]"
        f"(../assets/findings/weight_quantization/{figure.name})\n")
    atomic_write_text(src / "findings" / "weight-quantization.md", page)
    return [("Weight-only int4 and the super weight", "findings/weight-quantization.md")]


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


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
        "atlas_home": home_atlas(site), "atlas_committed": site.atlas is not None,
        "atlas_evidence": atlas_evidence(site), **helpers(),
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
    for page in sorted(src.rglob("*.md")):  # every table gets its caption
        if page.relative_to(src).parts[0] != "api":
            text = page.read_text(encoding="utf-8")
            if (captioned := caption_tables(text)) != text:
                atomic_write_text(page, captioned)
    if site.plan.name == "quick":
        committed = site.committed_pages()
        for page in sorted(src.rglob("*.md")):
            rel = page.relative_to(src)
            if rel.parts[0] not in NO_BANNER and rel.as_posix() not in committed:
                atomic_write_text(page, with_banner(page.read_text(encoding="utf-8"), site.plan))
    return gallery, findings


NO_BANNER = ("api", "reference", "census-schema.md")  # pages that show no result


def home_atlas(site: Site) -> str:
    """The home page's atlas section (docs/build/atlas_pages.py), or what to run to get one."""
    if site.atlas is not None:
        from docs.build.atlas_pages import home_section

        return home_section(site.atlas)
    return ("*No atlas is committed yet (`docs/results/`), so this page has no atlas table: "
            "import a finished one with `python -m docs.build --import-results atlas FOLDER` "
            "(see `docs/results/README.md`).*\n")


def atlas_evidence(site: Site) -> str:
    """The home page's cell-by-cell evidence of the committed atlas ('' without one)."""
    if site.atlas is None:
        return ""
    from docs.build.atlas_pages import changes_section, evidence_section

    return evidence_section(site.atlas) + "\n" + changes_section(site.atlas)


def quick_banner(plan: Plan) -> str:
    """The admonition every result page of a quick build opens with (all but the pages drawn
    from committed real-model results)."""
    models = ", ".join(f"`{m}`" for m in plan.scans)
    return (f'!!! warning quick-build "Quick build: tiny untrained models"\n'
            f"    The numbers, figures and tables on this page come from {models} (random-init "
            f"or tiny toy models) with a few short prompts: no real-model result of this page "
            f"is committed under `docs/results/`. They show what the page looks like, not what "
            f"trained models do; `python -m docs.build --full` computes it on the real models "
            f"(hours).\n\n")


def with_banner(text: str, plan: Plan) -> str:
    """``text`` with the quick-build banner after its ``# title`` (or at the top)."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.startswith("# "):
            return "\n".join([*lines[: i + 1], "", quick_banner(plan), *lines[i + 1:]])
    return quick_banner(plan) + text
