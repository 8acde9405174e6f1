"""Build the documentation site: run the experiments the pages show (cached), render the pages,
then ``mkdocs build``.

``make docs`` runs ``python -m mechsink.docs_build``. Steps:

1. **Experiments**, each cached in a folder named after a hash of its settings (under
   ``docs/_cache`` by default; a finished folder is reused, an unfinished one is redone): the sink
   census of every gallery model, the gallery's attention patterns, the circuits scripts
   (``structural_origin``, ``p0_sink``) on the main model, the code snippets the tutorials show
   (executed exactly as shown) and the notebooks (executed with nbclient on the main model).
2. **Pages**: every Markdown file under ``docs/`` is a Jinja template (numbers come from the
   JSON results, never typed in), copied into a staging folder with the figures (drawn from the
   JSON by :mod:`mechsink.viz`), a gallery page per model and a page per executed notebook.
3. **Site**: ``mkdocs build`` (Material theme, web fonts off, circuitsvis's JavaScript served
   from the site itself: nothing loads from the internet) into ``docs/_site``.

``--quick`` (or ``MECHSINK_DOCS_QUICK=1``) builds the same site on tiny models in about a
minute on two cores (the browser test uses it).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import io
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechsink.errors import MissingDependencyError
from mechsink.io import atomic_write_bytes, atomic_write_text

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
CACHE_VERSION = 1  # bump to invalidate every cached result
GALLERY_SCHEMA = "mechsink-gallery/1"
GALLERY_SEQ_LEN = 32
NOTEBOOKS = ("sink_census_walkthrough", "patching_walkthrough")
SNIPPETS = ("quickstart", "activation_patching", "path_patching", "interventions")
CIRCUITS = ("structural_origin", "p0_sink")


@dataclass(frozen=True)
class Plan:
    """Which models the site is built from, and with which settings."""

    name: str
    main: str  # the model of the concept pages, tutorials and notebooks
    scans: dict[str, dict[str, Any]]  # gallery model -> census settings
    circuit_args: dict[str, list[str]] = field(default_factory=dict)
    notebook_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # besides MODEL


SCAN_DEFAULTS = {"n": 32, "seq_len": 64, "eps": 0.3, "seed": 0, "batch_size": 8}

FULL = Plan(
    "full", "smollm2-135m",
    {"smollm2-135m": {**SCAN_DEFAULTS},
     "gemma3-270m": {**SCAN_DEFAULTS, "n": 8},
     "organism:bb-gpt2-tiny": {**SCAN_DEFAULTS},
     "random:llama-small": {**SCAN_DEFAULTS, "n": 8}},
    {"structural_origin": [], "p0_sink": []},
    {"sink_census_walkthrough": {"N": 8, "SEQ_LEN": 64}},
)
QUICK = Plan(
    "quick", "random:llama-tiny",
    {"random:llama-tiny": {**SCAN_DEFAULTS, "n": 4, "seq_len": 32},
     "organism:bb-gpt2-tiny": {**SCAN_DEFAULTS, "n": 4, "seq_len": 32}},
    {"structural_origin": ["--n", "4", "--seq-len", "32", "--positions", "8", "16",
                           "--scales", "0", "1", "2"],
     "p0_sink": ["--n", "4", "--seq-len", "32"]},
    {"sink_census_walkthrough": {"N": 4, "SEQ_LEN": 32}},
)


def log(msg: str) -> None:
    print(f"[docs] {msg}", file=sys.stderr, flush=True)


def slug(name: str) -> str:
    """A file-name-safe model name (``organism:bb-gpt2-tiny`` -> ``organism-bb-gpt2-tiny``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")


# --- the result cache --------------------------------------------------------------------------


class Cache:
    """Folders of finished results, one per (kind, model, settings)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.hits: list[str] = []
        self.runs: list[tuple[str, float]] = []

    def folder(self, kind: str, model: str, settings: Mapping[str, Any]) -> Path:
        key = json.dumps({"kind": kind, "model": model, "settings": settings,
                          "version": CACHE_VERSION}, sort_keys=True, default=str)
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        return self.root / f"{kind}-{slug(model)}-{digest}"

    def get(self, kind: str, model: str, settings: Mapping[str, Any],
            produce: Callable[[Path], None]) -> Path:
        """The finished folder for these settings, running ``produce(tmp_folder)`` if needed."""
        final = self.folder(kind, model, settings)
        if (final / ".done").is_file():
            self.hits.append(final.name)
            return final
        tmp = final.with_name(final.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        log(f"running {kind} on {model} ...")
        start = time.perf_counter()
        produce(tmp)
        took = time.perf_counter() - start
        atomic_write_text(tmp / "settings.json", json.dumps(
            {"kind": kind, "model": model, "settings": settings, "seconds": round(took, 1)},
            indent=1, sort_keys=True, default=str) + "\n")
        (tmp / ".done").touch()
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        self.runs.append((final.name, took))
        log(f"{kind} on {model}: {took:.1f} s")
        return final


class Models:
    """Loads each model once per build, only when a result is not cached."""

    def __init__(self) -> None:
        self._loaded: dict[str, Any] = {}

    def __call__(self, name: str) -> Any:
        if name not in self._loaded:
            from mechsink.zoo import load_model

            self._loaded.clear()  # one model in memory at a time
            self._loaded[name] = load_model(name, device="cpu",
                                            seed=0 if name.startswith("random:") else None)
        return self._loaded[name]


# --- experiments -------------------------------------------------------------------------------


def run_scan(cache: Cache, models: Models, model: str, settings: Mapping[str, Any]) -> dict:
    """The census of ``model`` (census.json only: figures are drawn at page time)."""
    from mechsink.census import census, read_census, write_census

    def produce(out: Path) -> None:
        c = census(models(model), n=settings["n"], seq_len=settings["seq_len"],
                   eps=settings["eps"], seed=settings["seed"],
                   batch_size=settings["batch_size"], model_name=model)
        write_census(c, out)

    return read_census(cache.get("scan", model, dict(settings), produce))


def run_gallery(cache: Cache, models: Models, model: str, data: Mapping[str, Any]) -> dict:
    """Patterns of the strongest sink heads and a few ordinary heads on one natural sequence."""
    from mechsink.viz.gallery import choose_heads, reference_run

    heads = choose_heads(data)
    ref = reference_run(data)
    seq_len = min(GALLERY_SEQ_LEN, int(data["settings"]["seq_len"]))
    settings = {"heads": heads, "variant": ref["variant"], "seq_len": seq_len, "seed": 0}

    def produce(out: Path) -> None:
        import torch

        from mechsink.prompts import make_prompts

        m = models(model)
        tokens = make_prompts(m, "natural", ref["variant"], n=1, seq_len=seq_len, seed=0).tokens
        layers = {layer for kind in heads.values() for layer, _, _ in kind}
        names = {f"blocks.{layer}.attn.hook_pattern" for layer in layers}
        with torch.no_grad():
            _, c = m.run_with_cache(tokens, names_filter=lambda n: n in names)
        tok = getattr(m, "tokenizer", None)
        strings = [tok.decode([i]) if tok is not None else str(i) for i in tokens[0].tolist()]
        rows = []
        for kind, chosen in heads.items():
            for layer, head, score in chosen:
                p = c[f"blocks.{layer}.attn.hook_pattern"][0, head].float()
                rows.append({"kind": kind, "layer": layer, "head": head,
                             "sink_score": round(score, 4),
                             "pattern": [[round(float(v), 4) for v in p[i, : i + 1]]
                                         for i in range(p.shape[0])]})
        doc = {"schema": GALLERY_SCHEMA, "model": model,
               "run": f"natural/{ref['variant']}", "seq_len": seq_len, "tokens": strings,
               "heads": rows}
        atomic_write_text(out / "gallery.json", json.dumps(doc, indent=1) + "\n")

    folder = cache.get("gallery", model, settings, produce)
    return json.loads((folder / "gallery.json").read_text(encoding="utf-8"))


def run_circuit(cache: Cache, name: str, model: str, args: list[str]) -> Path:
    """``mechsink circuit NAME MODEL --out DIR ARGS`` (in this process)."""
    script = ROOT / "circuits" / f"{name}.py"

    def produce(out: Path) -> None:
        argv = [name, "--out", str(out), "--model", model, *args]
        saved, sys.argv = sys.argv, argv
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                runpy.run_path(str(script), run_name="__main__")
        finally:
            sys.argv = saved

    digest = hashlib.sha256(script.read_bytes()).hexdigest()  # a changed script reruns
    return cache.get(f"circuit-{name}", model, {"args": args, "sha256": digest}, produce)


def snippet_source(name: str, model: str) -> str:
    """A snippet's code as shown on its page: the ``MODEL = ...`` line names ``model``."""
    src = (DOCS / "snippets" / f"{name}.py").read_text(encoding="utf-8")
    return re.sub(r"^MODEL = .*$", f"MODEL = {model!r}", src, count=1, flags=re.M)


def run_snippet(cache: Cache, name: str, model: str) -> dict[str, Any]:
    """Execute a snippet as shown (``OUT`` pointed at the result folder); keep its output."""
    code = snippet_source(name, model)

    def produce(out: Path) -> None:
        runnable = re.sub(r"^OUT = .*$", f"OUT = Path({str(out)!r})", code, count=1, flags=re.M)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), _quiet_warnings():
            exec(compile(runnable, f"docs/snippets/{name}.py", "exec"),  # noqa: S102
                 {"__name__": "__main__"})
        atomic_write_text(out / "output.txt", buf.getvalue())

    folder = cache.get(f"snippet-{name}", model,
                       {"sha256": hashlib.sha256(code.encode()).hexdigest()}, produce)
    return {"code": code.rstrip(), "output": (folder / "output.txt").read_text("utf-8").rstrip(),
            "folder": folder, "json": {f.stem: json.loads(f.read_text("utf-8"))
                                       for f in sorted(folder.glob("*.json"))
                                       if f.name != "settings.json"}}


@contextlib.contextmanager
def _quiet_warnings() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def set_parameters(nb: Any, params: Mapping[str, Any]) -> Any:
    """Replace the assignments of the cell tagged ``parameters`` with ``params``."""
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError("a notebook needs exactly one cell tagged 'parameters'")
    cell = cells[0]
    lines = cell.source.splitlines()
    for key, value in params.items():
        pattern = re.compile(rf"^{re.escape(key)}\s*=")
        hits = [i for i, line in enumerate(lines) if pattern.match(line)]
        if not hits:
            raise ValueError(f"the parameters cell has no {key} = ... line")
        lines[hits[0]] = f"{key} = {value!r}"
    cell.source = "\n".join(lines)
    return nb


def execute_notebook(path: Path, params: Mapping[str, Any], cwd: Path,
                     timeout: int = 900) -> Any:
    """Run a notebook with nbclient after setting its parameters; returns the executed notebook."""
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError as exc:
        raise MissingDependencyError("executing notebooks needs nbclient, nbformat and "
                                     "ipykernel: pip install -e '.[docs]'") from exc
    nb = set_parameters(nbformat.read(path, as_version=4), params)
    env_cwd = str(cwd)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": env_cwd}}).execute()
    return nb


def run_notebook(cache: Cache, name: str, model: str, extra: Mapping[str, Any]) -> Path:
    """The executed notebook (``executed.ipynb``) with ``MODEL = model`` and ``extra``."""
    src = DOCS / "notebooks" / f"{name}.ipynb"
    params = {"MODEL": model, **extra}

    def produce(out: Path) -> None:
        import nbformat

        nb = execute_notebook(src, params, out)
        atomic_write_text(out / "executed.ipynb", nbformat.writes(nb))

    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    return cache.get(f"notebook-{name}", model, {"sha256": digest, "params": params}, produce)


# --- notebook -> Markdown ----------------------------------------------------------------------


def _text(x: Any) -> str:
    return "".join(x) if isinstance(x, list) else str(x)


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}\n"


def notebook_markdown(nb: Any, files_dir: Path, files_url: str) -> str:
    """Markdown for an executed notebook: cells in order, outputs under their code; PNG outputs
    are written into ``files_dir`` and linked as ``files_url/NAME``. HTML outputs are not
    copied (they could load scripts from elsewhere); their text form is shown instead."""
    parts, n_img = [], 0
    ansi = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(_text(cell.source) + "\n")
            continue
        if cell.cell_type != "code":
            continue
        parts.append(_fence(_text(cell.source), "python"))
        stdout: list[str] = []  # consecutive prints become one block; stderr (warnings,
        for out in [*cell.get("outputs", []), {"output_type": "end"}]:  # progress) is left out
            kind = out.get("output_type")
            if kind == "stream":
                if out.get("name") == "stdout":
                    stdout.append(ansi.sub("", _text(out.get("text", ""))))
                continue
            if stdout:
                parts.append(_fence("".join(stdout), "text"))
                stdout = []
            if kind in ("execute_result", "display_data"):
                data = out.get("data", {})
                if "image/png" in data:
                    n_img += 1
                    files_dir.mkdir(parents=True, exist_ok=True)
                    name = f"output-{n_img}.png"
                    atomic_write_bytes(files_dir / name, base64.b64decode(_text(data["image/png"])))
                    parts.append(f"![output {n_img}]({files_url}/{name})\n")
                elif "text/markdown" in data:
                    parts.append(_text(data["text/markdown"]) + "\n")
                elif "text/plain" in data:
                    parts.append(_fence(_text(data["text/plain"]), "text"))
            elif kind == "error":
                raise RuntimeError(f"notebook cell failed: {out.get('ename')}: {out.get('evalue')}")
    return "\n".join(parts)


# --- pages -------------------------------------------------------------------------------------


def fmt(x: Any, digits: int = 3) -> str:
    """A number as the pages print it (``-`` for a missing value)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x != 0 and (abs(x) >= 10 ** 6 or abs(x) < 10 ** -3):
            return f"{x:.{digits}g}"
        if abs(x) >= 100:
            return f"{x:.0f}"
        return f"{x:.{digits}f}".rstrip("0").rstrip(".")
    return str(x)


def run_of(data: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The census run called ``suite/variant`` (the first run if absent)."""
    return next((r for r in data["runs"] if r["name"] == name), data["runs"][0])


def sink_rate_table(data: Mapping[str, Any]) -> str:
    """Markdown table: sink rate per suite (rows) and first-token variant (columns)."""
    suites, variants = data["settings"]["suites"], data["settings"]["variants"]
    head = "| input | " + " | ".join(variants) + " |\n|---|" + "---|" * len(variants) + "\n"
    rows = []
    for s in suites:
        cells = []
        for v in variants:
            r = next((r for r in data["runs"] if r["suite"] == s and r["variant"] == v), None)
            cells.append("-" if r is None else
                         f"{fmt(r['sink_rate'])} ({fmt(r['sink_rate_no_self'])})")
        rows.append(f"| {s} | " + " | ".join(cells) + " |")
    return head + "\n".join(rows) + "\n"


def massive_table(data: Mapping[str, Any], run: str, k: int = 5, median: str = "token") -> str:
    """The ``k`` largest massive activations of a run; ``median="token"`` (the median of the
    token's own channels, SCIENCE.md) or ``"layer"`` (of the whole layer, Sun et al.'s code)."""
    r = run_of(data, run)
    key = "massive_activations" if median == "token" else "massive_activations_layer_median"
    items = sorted(r[key], key=lambda m: -abs(m["max_abs"]))[:k]
    if not items:
        return (f"*No massive activations on {r['name']} with the {median} median "
                f"({len(r[key])} entries).*\n")
    lines = ["| layer | position | channel | mean value | x median | max abs | sequences |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {m['layer']} | {m['position']} | {m['channel']} | {fmt(m['value'])} | "
              f"{fmt(m['ratio_to_median'])} | {fmt(m['max_abs'])} | {m['count']} |"
              for m in items]
    return "\n".join(lines) + "\n"


def super_neuron_table(data: Mapping[str, Any], run: str, k: int = 6) -> str:
    r = run_of(data, run)
    items = sorted(r["super_neurons"], key=lambda m: -abs(m["activation"]))[:k]
    if not items:
        return f"*No super neurons on {r['name']}.*\n"
    lines = ["| layer | neuron | channel | position | activation | super weight | MLP output | "
             "sequences |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {m['layer']} | {m['neuron']} | {m['channel']} | {m['position']} | "
              f"{fmt(m['activation'])} | {fmt(m['weight'])} | {fmt(m['output'])} | {m['count']} |"
              for m in items]
    return "\n".join(lines) + "\n"


def norm_ratio_table(data: Mapping[str, Any]) -> str:
    lines = ["| input | largest ratio | at layer | ratio after the last layer |",
             "|---|---|---|---|"]
    for r in data["runs"]:
        vals = [v for v in r["first_token_norm_ratio"] if v is not None]
        if not vals:
            continue
        best = max(vals)
        lines.append(f"| {r['name']} | {fmt(best)} | {r['first_token_norm_ratio'].index(best)} "
                     f"| {fmt(r['first_token_norm_ratio'][-1])} |")
    return "\n".join(lines) + "\n"


def variance_table(data: Mapping[str, Any]) -> str:
    lines = ["| input | Var(pos 0)/Var(pos>0), layer 0 | median over layers | "
             "uniform-mixing prediction, layer 0 |", "|---|---|---|---|"]
    for r in data["runs"]:
        if r["variant"] != "randfirst":
            continue
        vd = r["variance_discrepancy"]
        ratios = sorted(v for v in vd["ratio"] if v is not None)
        med = ratios[len(ratios) // 2] if ratios else None
        lines.append(f"| {r['name']} | {fmt(vd['ratio'][0])} | {fmt(med)} | "
                     f"{fmt(vd['predicted_ratio'][0])} |")
    return "\n".join(lines) + "\n"


def path_table(results: Mapping[str, Mapping[str, Any]], k: int = 8) -> str:
    """Markdown table of path-patching effects (value - clean value) per sender, one column per
    result (``path_recomputed``, ``path_frozen``), largest drop under the first one first."""
    names = sorted(results, key=lambda n: (n != "path_recomputed", n))  # the model's own first
    first = results[names[0]]
    senders = first["labels"][first["axes"][0]]
    effects = {n: dict(zip(r["labels"][r["axes"][0]],
                           (v - r["clean_value"] for v in r["values"]), strict=True))
               for n, r in results.items()}
    order = sorted(senders, key=lambda s: effects[names[0]][s])[:k]
    head = "| sender | " + " | ".join(n.replace("path_", "scales = ") for n in names) + " |"
    lines = [head, "|---|" + "---|" * len(names)]
    lines += [f"| `{s}` | " + " | ".join(f"{effects[n][s]:+.4f}" for n in names) + " |"
              for s in order]
    return "\n".join(lines) + "\n"


def settings_line(data: Mapping[str, Any]) -> str:
    s = data["settings"]
    return (f"`{data['model']}`, n = {s['n']} sequences of T = {s['seq_len']} tokens per input "
            f"(suites {', '.join(s['suites'])}; first token {', '.join(s['variants'])}), "
            f"seed {s['seed']}, eps = {s['eps']}, {s['dtype']} on {s['device']}")


def summary_body(md: str) -> str:
    """A circuits ``summary.md`` without its title and image lines (the page has its own)."""
    lines: list[str] = []
    for line in md.splitlines():
        if line.startswith(("# ", "![")):
            continue
        if line.startswith("|"):
            if lines and lines[-1].strip() and not lines[-1].startswith("|"):
                lines.append("")  # a Markdown table needs a blank line before it
            line = escape_cell_pipes(line)
        lines.append(line)
    return "\n".join(lines).strip() + "\n"


def escape_cell_pipes(row: str) -> str:
    """Escape the pipes of ``|x|`` inside the cells of a Markdown table row (a column separator
    has whitespace or the line's end on both sides); separator rows are left alone."""
    if re.fullmatch(r"[\s|:-]+", row):
        return row
    return re.sub(r"(?<!\\)\|", lambda m: "|" if _is_separator(row, m.start()) else "\\|", row)


def _is_separator(row: str, i: int) -> bool:
    before = i == 0 or row[i - 1].isspace()
    after = i == len(row) - 1 or row[i + 1].isspace()
    return before and after


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


def collect(plan: Plan, cache: Cache, notebooks: bool = True) -> Site:
    """Run (or reuse) every experiment of ``plan``."""
    models = Models()
    census, gallery = {}, {}
    for model, settings in plan.scans.items():
        census[model] = run_scan(cache, models, model, settings)
        gallery[model] = run_gallery(cache, models, model, census[model])
    models = Models()  # free the last model before the circuits load their own
    circuits = {}
    for name in CIRCUITS:
        folder = run_circuit(cache, name, plan.main, plan.circuit_args.get(name, []))
        circuits[name] = {"folder": folder,
                          "result": json.loads((folder / "result.json").read_text("utf-8")),
                          "summary": summary_body((folder / "summary.md").read_text("utf-8")),
                          "figures": sorted(f.name for f in folder.glob("*.png"))}
    snippets = {name: run_snippet(cache, name, plan.main) for name in SNIPPETS}
    nbs = ({name: run_notebook(cache, name, plan.main, plan.notebook_params.get(name, {}))
            for name in NOTEBOOKS} if notebooks else {})
    return Site(plan, census, gallery, circuits, snippets, nbs, cache)


def _copy_sources(dst: Path) -> list[Path]:
    """Copy ``docs/`` into ``dst`` (without build outputs and private folders); the .md files."""
    def ignore(folder: str, names: list[str]) -> list[str]:
        top = Path(folder) == DOCS
        return [n for n in names if (top and n.startswith("_")) or n == "__pycache__"
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
        atomic_write_text(folder / "census.json", json.dumps(data, indent=1, sort_keys=True) + "\n")
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
    from mechsink.viz.gallery import gallery_blocks

    template = env.from_string((DOCS / "_templates" / "gallery_model.md").read_text("utf-8"))
    pages = []
    for i, (model, data) in enumerate(site.census.items()):
        rel = f"gallery/{slug(model)}.md"
        text = template.render(model=model, data=data, s=slug(model), assets="../assets",
                               attention=gallery_blocks(site.gallery[model], prefix=f"cv{i}"),
                               gallery=site.gallery[model], **_helpers())
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


def _helpers() -> dict[str, Any]:
    return {"fmt": fmt, "run_of": run_of, "sink_rate_table": sink_rate_table,
            "massive_table": massive_table, "super_neuron_table": super_neuron_table,
            "norm_ratio_table": norm_ratio_table, "variance_table": variance_table,
            "settings_line": settings_line, "slug": slug, "path_table": path_table}


def render_pages(site: Site, src: Path) -> list[tuple[str, str]]:
    """Copy and render every page into ``src``; returns the gallery pages for the nav."""
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
        **_helpers(),
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
    if site.notebooks:
        write_notebook_pages(site, src)
    return gallery


def write_config(work: Path, src: Path, site_dir: Path, gallery: list[tuple[str, str]],
                 notebooks: bool) -> Path:
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
        nav.append({title: value})
    cfg["nav"] = nav
    for plugin in cfg.get("plugins", []):
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT)]
    path = work / "mkdocs.yml"
    atomic_write_text(path, yaml.safe_dump(cfg, sort_keys=False))
    return path


def build(plan: Plan = FULL, *, site_dir: Path | None = None, cache_dir: Path | None = None,
          work_dir: Path | None = None, notebooks: bool = True) -> Path:
    """Run the experiments (cached), render the pages and build the site; returns site_dir."""
    start = time.perf_counter()
    site_dir = Path(site_dir or DOCS / "_site").resolve()
    cache = Cache(Path(cache_dir or DOCS / "_cache").resolve())
    work = Path(work_dir or DOCS / "_build").resolve()
    site = collect(plan, cache, notebooks=notebooks)
    t_exp = time.perf_counter() - start
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    gallery = render_pages(site, src)
    config = write_config(work, src, site_dir, gallery, notebooks)
    t_mk = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--clean", "--strict",
                           "-q", "-f", str(config)], cwd=work, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"mkdocs build failed:\n{proc.stdout}\n{proc.stderr}")
    log(f"{plan.name} build: experiments {t_exp:.1f} s ({len(cache.runs)} run, "
        f"{len(cache.hits)} cached), mkdocs {time.perf_counter() - t_mk:.1f} s, "
        f"total {time.perf_counter() - start:.1f} s -> {site_dir}")
    return site_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mechsink.docs_build",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        default=os.environ.get("MECHSINK_DOCS_QUICK", "") not in ("", "0"),
                        help="tiny models only (seconds; what the browser test builds)")
    parser.add_argument("--site", type=Path, default=None, help="output folder (docs/_site)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="experiment cache (docs/_cache)")
    parser.add_argument("--work", type=Path, default=None, help="staging folder (docs/_build)")
    parser.add_argument("--no-notebooks", action="store_true",
                        help="skip executing and rendering the notebooks")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = build(QUICK if args.quick else FULL, site_dir=args.site, cache_dir=args.cache,
                work_dir=args.work, notebooks=not args.no_notebooks)
    print(out / "index.html")


if __name__ == "__main__":
    main()
