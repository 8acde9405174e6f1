"""The experiments the pages show, each run once and cached: census, gallery patterns, the
experiments of :mod:`mechsink.experiments`, the code snippets (executed as shown) and notebooks."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from jaxtyping import Int
from torch import Tensor

from docs.build.cache import Cache, Models, log
from docs.build.notebooks import execute_notebook
from docs.build.plan import DOCS, GALLERY_SCHEMA, GALLERY_SEQ_LEN, ROOT
from mechsink.io import atomic_write_json, atomic_write_text
from mechsink.model import act_name, token_strings

REUSABLE_CENSUS = (ROOT / "report" / "census.json",)  # what `make demo` writes
CENSUS_KEYS = ("n", "seq_len", "eps", "seed", "key_position")  # what decides the numbers


def census_digest(data: Mapping[str, Any]) -> str:
    """A census's identity: model, mechsink version, suites, variants and the settings that
    decide its numbers (not batch_size, dtype of the cache files, or the device)."""
    s = data["settings"]
    key = {"model": data["model"], "mechsink_version": data.get("mechsink_version"),
           "suites": sorted(s["suites"]), "variants": sorted(s["variants"]),
           **{k: s.get(k, 0 if k == "key_position" else None) for k in CENSUS_KEYS}}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def wanted_census_digest(model: str, settings: Mapping[str, Any]) -> str:
    """The digest the census of ``model`` with the plan's ``settings`` will have."""
    from mechsink import __version__
    from mechsink.measure.census import SUITES, VARIANTS

    return census_digest({"model": model, "mechsink_version": __version__,
                          "settings": {**settings, "suites": list(SUITES),
                                       "variants": list(VARIANTS), "key_position": 0}})


def reusable_census(model: str, settings: Mapping[str, Any],
                    candidates: tuple[Path, ...] = REUSABLE_CENSUS) -> Path | None:
    """A census.json already on disk (``make demo``'s) that is exactly the one this build would
    compute (same digest), or None."""
    want = wanted_census_digest(model, settings)
    for path in candidates:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            if census_digest(data) == want:
                return Path(path)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def run_scan(cache: Cache, models: Models, model: str, settings: Mapping[str, Any],
             reuse: tuple[Path, ...] = REUSABLE_CENSUS) -> dict:
    """The census of ``model`` (census.json only: figures are drawn at page time): from the
    cache, else copied from ``reuse`` (``report/census.json``) when its digest matches, else
    computed."""
    import shutil

    from mechsink.measure.census import CENSUS_FILE, census, read_census, write_census

    def produce(out: Path) -> None:
        found = reusable_census(model, settings, reuse)
        if found is not None:
            log(f"reusing {found} (same model, suites, variants and settings)")
            shutil.copy2(found, out / CENSUS_FILE)
            return
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
    settings = {"heads": heads, "variant": ref["variant"], "seq_len": seq_len, "seed": 0,
                "inputs_checked": [data["settings"].get(k) for k in ("n", "seq_len", "seed")]}

    def produce(out: Path) -> None:
        import torch

        from mechsink.inputs.prompts import make_prompts

        m = models(model)
        tokens = make_prompts(m, "natural", ref["variant"], n=1, seq_len=seq_len, seed=0).tokens
        layers = {layer for kind in heads.values() for layer, _, _ in kind}
        names = {act_name("pattern", layer) for layer in layers}
        with torch.no_grad():
            _, c = m.run_with_cache(tokens, names_filter=lambda n: n in names)
        strings = token_strings(m, tokens[0])
        rows = []
        for kind, chosen in heads.items():
            for layer, head, score in chosen:
                p = c[act_name("pattern", layer)][0, head].float()
                rows.append({"kind": kind, "layer": layer, "head": head,
                             "sink_score": round(score, 4),
                             "pattern": [[round(float(v), 4) for v in p[i, : i + 1]]
                                         for i in range(p.shape[0])]})
        doc = {"schema": GALLERY_SCHEMA, "model": model,
               "run": f"natural/{ref['variant']}", "seq_len": seq_len, "tokens": strings,
               "identical": degenerate(tokens, "natural"), "heads": rows,
               "inputs": census_inputs(m, data)}
        atomic_write_json(out / "gallery.json", doc)

    folder = cache.get("gallery", model, settings, produce)
    return json.loads((folder / "gallery.json").read_text(encoding="utf-8"))


def degenerate(tokens: Int[Tensor, "batch pos"], suite: str) -> bool:
    """True when a batch of sequences carries no text: one token id in the whole batch, or (for
    any suite but ``repeated``, whose bodies repeat one token by design) one id in every row
    after the first position. Such a run is flagged on the page, not shown as text."""
    if tokens.unique().numel() <= 1:
        return True
    body = tokens[:, 1:]
    return suite != "repeated" and bool((body == body[:, :1]).all())


def census_inputs(model: Any, data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """For each suite/variant of a census: how many distinct token ids its inputs hold and
    whether they are :func:`degenerate` (the inputs are rebuilt from the census's settings)."""
    from mechsink.inputs.prompts import make_prompts

    s = data["settings"]
    if s.get("n") is None or s.get("seq_len") is None:  # a census of given prompts
        return {}
    out = {}
    for suite in s["suites"]:
        for variant in s["variants"]:
            tokens = make_prompts(model, suite, variant, n=int(s["n"]), seq_len=int(s["seq_len"]),
                                  seed=int(s.get("seed", 0))).tokens
            out[f"{suite}/{variant}"] = {"distinct_tokens": int(tokens.unique().numel()),
                                         "identical": degenerate(tokens, suite)}
    return out


def run_circuit(cache: Cache, models: Models, name: str, model: str,
                settings: Mapping[str, Any]) -> Path:
    """The experiment ``name`` of :mod:`mechsink.experiments` on ``model`` (result folder)."""
    from mechsink.experiments import get_experiment

    experiment = get_experiment(name)

    def produce(out: Path) -> None:
        experiment.run(models(model), model_name=model, **settings).save(out)

    code = b"".join(Path(f).read_bytes() for f in (experiment.module.__file__,
                                                   ROOT / "mechsink" / "viz" / "experiments.py"))
    digest = hashlib.sha256(code).hexdigest()  # a changed experiment or figure reruns
    return cache.get(f"circuit-{name}", model, {"settings": dict(settings), "sha256": digest},
                     produce)


def run_finding(cache: Cache, models: Models, name: str, settings: Mapping[str, Any],
                main: str, done: Mapping[str, Path]) -> tuple[Path, str | None, dict[str, Any]]:
    """The experiment of a finding page (result folder, model or None, run()'s settings): with
    a model (``settings["model"]``, default ``main``), or training its own in ``work/`` inside
    the result folder; ``run_dir`` ``@EXPERIMENT:PATH`` points into an earlier finding's."""
    from mechsink.experiments import get_experiment

    experiment = get_experiment(name)
    settings = dict(settings)
    model = settings.pop("model", main) if experiment.needs_model else None
    settings.pop("model", None)
    if isinstance(settings.get("run_dir"), str) and settings["run_dir"].startswith("@"):
        other, _, rel = settings["run_dir"][1:].partition(":")
        settings["run_dir"] = str(done[other] / "work" / rel)
    if model is not None:
        return run_circuit(cache, models, name, model, settings), model, settings

    def produce(out: Path) -> None:
        extra = {"work_dir": out / "work"} if "work_dir" in experiment.settings() else {}
        experiment.run(**settings, **extra).save(out)

    code = Path(experiment.module.__file__).read_bytes()
    folder = cache.get(f"circuit-{name}", "trained", {
        "settings": settings, "sha256": hashlib.sha256(code).hexdigest()}, produce)
    return folder, None, settings


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
