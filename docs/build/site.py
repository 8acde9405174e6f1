"""The whole build: run (or reuse) every experiment of a plan, render the pages, write the
mkdocs configuration and run ``mkdocs build``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from docs.build.cache import Cache, Models, log
from docs.build.pages import Site, render_pages
from docs.build.plan import CIRCUITS, CONFIG, DOCS, NOTEBOOKS, QUICK, ROOT, SNIPPETS, Plan
from docs.build.results import RESULTS, load_atlas, rerun_atlas
from docs.build.runners import (
    run_circuit,
    run_finding,
    run_gallery,
    run_notebook,
    run_scan,
    run_snippet,
)
from docs.build.tables import summary_body
from mechsink.io import atomic_write_text


def collect(plan: Plan, cache: Cache, notebooks: bool = True, atlas: Any = None) -> Site:
    """Run (or reuse) every experiment of ``plan``; ``atlas``: the committed atlas
    (:func:`docs.build.results.load_atlas`), whose pages need no run."""
    models = Models()
    census, gallery = {}, {}
    for model, settings in plan.scans.items():
        census[model] = run_scan(cache, models, model, settings)
        gallery[model] = run_gallery(cache, models, model, census[model])
    circuits = {}
    for name in CIRCUITS:  # the pool keeps the main model loaded across the experiments
        folder = run_circuit(cache, models, name, plan.main, plan.circuit_settings.get(name, {}))
        circuits[name] = {"folder": folder,
                          "result": json.loads((folder / "result.json").read_text("utf-8")),
                          "summary": summary_body((folder / "summary.md").read_text("utf-8")),
                          "figures": sorted(f.name for f in folder.glob("*.png"))}
    done = {name: c["folder"] for name, c in circuits.items()}
    findings = {}
    from docs.build.atlas_pages import step_rows

    for name, settings in plan.findings.items():
        if atlas is not None and step_rows(atlas, name):
            continue  # the committed atlas feeds this page
        folder, model, used = run_finding(cache, models, name, settings, plan.main, done)
        done[name] = folder
        findings[name] = {"folder": folder, "model": model, "settings": used}
    for name in CIRCUITS:
        findings[name] = {"folder": circuits[name]["folder"], "model": plan.main,
                          "settings": plan.circuit_settings.get(name, {})}
    snippets = {name: run_snippet(cache, name, plan.main) for name in SNIPPETS}
    nbs = ({name: run_notebook(cache, name, plan.main, plan.notebook_params.get(name, {}))
            for name in NOTEBOOKS} if notebooks else {})
    return Site(plan, census, gallery, circuits, snippets, nbs, cache, findings, atlas)


def write_config(work: Path, src: Path, site_dir: Path, gallery: list[tuple[str, str]],
                 notebooks: bool, findings: list[tuple[str, str]] | None = None) -> Path:
    """The mkdocs.yml for this build: the repository's, with the folders and nav filled in."""
    import yaml

    cfg = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    cfg["docs_dir"] = str(src)
    cfg["site_dir"] = str(site_dir)
    nav = []
    for item in cfg["nav"]:
        (title, value), = item.items()
        if title == "Gallery":
            value = [{"Overview": "gallery/index.md"}] + [{m: p} for m, p in gallery]
        if title == "Notebooks" and not notebooks:
            continue
        if title == "Findings":
            if not findings:
                continue
            value = [{"Overview": "findings/index.md"}] + [{t: p} for t, p in findings]
        nav.append({title: value})
    cfg["nav"] = nav
    cfg["hooks"] = [str(ROOT / h) for h in cfg.get("hooks", [])]  # the config moves to work/
    for plugin in cfg.get("plugins", []):
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            python = plugin["mkdocstrings"]["handlers"]["python"]
            python["paths"] = [str(ROOT)]
            python["options"]["extensions"] = [
                str(ROOT / e) if isinstance(e, str) and e.split(":")[0].endswith(".py") else e
                for e in python["options"].get("extensions", [])]
    path = work / "mkdocs.yml"
    atomic_write_text(path, yaml.safe_dump(cfg, sort_keys=False))
    return path


def build(plan: Plan = QUICK, *, site_dir: Path | None = None, cache_dir: Path | None = None,
          work_dir: Path | None = None, notebooks: bool = True,
          rerun: tuple[str, ...] = (), results: Path | None = RESULTS) -> Path:
    """Read the committed results (``results``: docs/results; None: none), run the other
    experiments (cached; ``rerun``: kinds to redo anyway, e.g. ``circuit-*``; ``atlas`` reruns
    the committed atlas on the real models and imports it), render the pages and build the
    site; returns site_dir."""
    start = time.perf_counter()
    site_dir = Path(site_dir or DOCS / "_site").resolve()
    cache = Cache(Path(cache_dir or DOCS / "_cache").resolve(), rerun=rerun)
    work = Path(work_dir or DOCS / "_build").resolve()
    atlas = None
    if results is not None:
        if "atlas" in rerun:
            log(f"rerunning the atlas on {', '.join(plan.atlas['models'])} (real models: "
                f"hours; resumable in {cache.root / 'atlas-rerun'}) ...")
            rerun_atlas(plan.atlas, cache.root / "atlas-rerun", root=Path(results))
        atlas = load_atlas(plan.atlas, root=Path(results))
        if atlas is not None:
            log(f"committed atlas: {len(atlas.data['models'])} models, made "
                f"{atlas.entry.get('made')} by `{atlas.entry.get('command')}`")
            for note in atlas.notes:
                log(note)
    site = collect(plan, cache, notebooks=notebooks, atlas=atlas)
    t_exp = time.perf_counter() - start
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    gallery, findings = render_pages(site, src)
    config = write_config(work, src, site_dir, gallery, notebooks, findings)
    t_mk = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--clean", "--strict",
                           "-q", "-f", str(config)], cwd=work, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"mkdocs build failed:\n{proc.stdout}\n{proc.stderr}")
    log(f"{plan.name} build: experiments {t_exp:.1f} s ({len(cache.runs)} run, "
        f"{len(cache.hits)} cached), mkdocs {time.perf_counter() - t_mk:.1f} s, "
        f"total {time.perf_counter() - start:.1f} s -> {site_dir}")
    if cache.stale:
        log(f"{len(cache.stale)} cached results were made by other mechsink code (reused; "
            f"--rerun KIND redoes them): {', '.join(cache.stale)}")
    return site_dir
