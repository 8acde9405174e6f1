"""The sink atlas: every claim of the attention-sink papers on every model, one run each with the
same prompts, seeds and settings, as one table (JSON, Markdown, HTML) that links each cell to
the experiment folder behind it.

Claims (each cell: a verdict, its key figure, the criterion it was judged by):

- C1 variance discrepancy, C2 super neurons, C3 the sink made by the massive state, C4 moving the
  sink: :mod:`mechsink.experiments.structural_origin` (Li, Jiang, Sun et al. 2026, "The
  Structural Origin of Attention Sink"; Sun et al. 2024, "Massive Activations in Large Language
  Models");
- C5 the P0-sink circuit and whether it needs BOS: :mod:`mechsink.experiments.p0_sink` (Peng, Li
  et al. 2026, "How Attention Sinks Emerge in Large Language Models");
- C6 the query-bias circuit, dosed (where the model has ``b_Q``):
  :mod:`mechsink.experiments.query_bias_dose`;
- C7 structure at initialisation, on random-init twins of the model's architecture: token
  preference and contraction, and position 0's discrepancy in it
  (:mod:`mechsink.experiments.init_structure`; Li, Tong, Wang et al. 2026, "SeedPrint").

Beside the claims, the first-token table: the sink rate of each model on every prompt suite x
first-token variant (Gu et al. 2024, "When Attention Sink Emerges in Language Models").

Resumable by model and step: each step writes its folder whole under ``out/<model>/<step>/``
with the settings it ran under; a rerun with the same settings reads it instead of running.
"""

from __future__ import annotations

import gc
import hashlib
import html
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mechsink.errors import BadInputError, MechsinkError
from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult
from mechsink.interventions.readout import measure
from mechsink.interventions.stats import mean_interval
from mechsink.io import atomic_write_json, atomic_write_text
from mechsink.measure.sinks import DEFAULT_EPS

SCHEMA = "mechsink-atlas/1"
RESULT_FILE = "atlas.json"
FIGURE = None
DEFAULT_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-0.5b", "organism:bb-gpt2-tiny",
                  "random:llama-mini")
CLAIMS = {
    "C1": "variance discrepancy at position 0",
    "C2": "super neurons build the massive channel",
    "C3": "the sink comes from the massive state",
    "C4": "the sink can be moved",
    "C5": "the P0-sink circuit (no BOS needed)",
    "C6": "the query-bias circuit (b_Q . k_0 makes key 0 win)",
    "C7": "structure at random initialisation",
}
STEP_FILE = "atlas-step.json"
CELLS_FILE = "atlas-cells.json"
TWIN_SEEDS = 2  # C7: random-init twins per model (seeds seed, seed + 1: the direction across seeds)


def _slug(name: str) -> str:
    """A folder name for a model name, distinct for distinct names (a digest is appended)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:40] or "model"
    return f"{readable}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def check_models(models: Sequence[str]) -> list[str]:
    """The model names, checked before any work (unknown names, repeats, missing folders)."""
    from mechsink.model.zoo.entries import NAMED_MODELS
    from mechsink.model.zoo.random_init import random_config

    names = [str(m) for m in models]
    if not names:
        raise BadInputError("the atlas needs at least one model.")
    if len(set(names)) != len(names):
        raise BadInputError(f"a model is listed twice: {names}.")
    for name in names:
        prefix, _, rest = name.partition(":")
        if name in NAMED_MODELS:
            continue
        if prefix == "random" and rest:
            random_config(rest)  # raises on a malformed name
        elif prefix in ("organism", "hf") and rest:
            folder = Path(rest)
            if prefix == "organism" and not folder.is_absolute() and not folder.exists():
                continue  # a shipped organism name (bb-gpt2-tiny): resolved on load
            if not folder.is_dir():
                raise BadInputError(f"{name}: no folder {rest!r}.")
        else:
            raise BadInputError(f"unknown model {name!r}: name a zoo model, random:<family>-"
                                "<size>, organism:<folder> or hf:<folder> (`mechsink models`).")
    return names


def _step(folder: Path, key: dict[str, Any], compute: Callable[[], ExperimentResult],
          name: str) -> tuple[ExperimentResult | None, str | None]:
    """Run one step into ``folder`` or read it back when it ran under the same ``key`` (its
    verdicts judged again by today's criteria, and saved so when they changed); a step that
    cannot apply to this model gives (None, the one-line reason)."""
    marker = folder / STEP_FILE
    if marker.is_file():
        saved = json.loads(marker.read_text(encoding="utf-8"))
        if saved.get("key") == key:
            if saved.get("not_applicable"):
                return None, saved["not_applicable"]
            stored = ExperimentResult.load(folder, name)
            judged = stored.judged()
            if judged.data != stored.data:
                judged.save(folder)
            return judged, None
    try:
        result = compute()
    except MechsinkError as exc:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(marker, {"key": key, "not_applicable": str(exc).splitlines()[0]})
        return None, str(exc).splitlines()[0]
    result.save(folder)
    atomic_write_json(marker, {"key": key})
    return result, None


def _sink_rate(model: Any, tokens: torch.Tensor, eps: float, batch_size: int) -> dict[str, Any]:
    """Gu et al.'s sink rate at key 0 per prompt (fraction of heads over ``eps``), with its
    interval over prompts."""
    r = measure(model, tokens, batch_size=batch_size)
    rate = (r.scores > eps).double().flatten(1).mean(1)
    return mean_interval(rate).to_dict()


def first_token_table(model: Any, n: int, seq_len: int, seed: int, eps: float,
                      batch_size: int) -> dict[str, dict[str, Any]]:
    """The sink rate on every suite x first-token variant (the same prompts for every model
    that shares a tokenizer); the suites of one length read in one batched run."""
    from mechsink.inputs.prompts import SUITES, VARIANTS, make_prompts
    from mechsink.interventions.stacked import ROWS_PER_FORWARD, SPEEDUPS

    out: dict[str, dict[str, Any]] = {}
    made: dict[str, torch.Tensor] = {}
    for suite in SUITES:
        for variant in VARIANTS:
            try:
                p = make_prompts(model, suite, variant, n=n, seq_len=seq_len, seed=seed)
            except MechsinkError as exc:
                out[f"{suite}/{variant}"] = {"not_applicable": str(exc).splitlines()[0]}
                continue
            made[f"{suite}/{variant}"] = p.tokens
    if not SPEEDUPS["stacked"]:
        for key, tokens in made.items():
            out[key] = _sink_rate(model, tokens, eps, batch_size)
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for key, tokens in made.items() if SPEEDUPS["stacked"] else ():
        by_shape.setdefault(tuple(tokens.shape), []).append(key)
    for keys in by_shape.values():  # one run per length: each sequence's scores are its own
        r = measure(model, torch.cat([made[k] for k in keys]),
                    batch_size=max(batch_size, ROWS_PER_FORWARD), loss=False)
        rate = (r.scores > eps).double().flatten(1).mean(1)
        start = 0
        for key in keys:
            rows = int(made[key].shape[0])
            out[key] = mean_interval(rate[start:start + rows]).to_dict()
            start += rows
    return {f"{s}/{v}": out[f"{s}/{v}"] for s in SUITES for v in VARIANTS}


def c7_twins(build: Callable[[int], Any], settings: dict[str, Any]) -> dict[str, Any]:
    """C7's init-time measurements on :data:`TWIN_SEEDS` random-init twins (the atlas's n and
    seq_len of random input, the architecture's own init scale)."""
    from mechsink.experiments.init_structure import twin_profiles

    seeds = [settings["seed"] + i for i in range(TWIN_SEEDS)]
    return twin_profiles(build, seeds, settings.get("n_census", settings["n"]),
                         settings["seq_len"], scales=(1.0,))


def c7_cell(twins: dict[str, Any]) -> dict[str, Any]:
    """C7 as the paper states it, judged on the twins: (i) token preference and contraction,
    (iii) position 0's discrepancy at init; (ii) and (iii)'s causal part need the model's own
    initialisation seed, unknown for a trained model: the organisms answer them."""
    parts = twins["verdicts"]
    held = [v["verdict"] == "supported" for v in parts.values()]
    return {"verdict": "supported" if all(held) else "partial" if any(held) else "not supported",
            "criterion": f"supported if every part holds on random-init twins of this "
                         f"architecture (seeds {twins['seeds']}), partial if some do: "
                         + "; ".join(f"{k}: {v['criterion']}" for k, v in parts.items())
                         + ". (ii) SeedPrint and (iii)'s causal link need the model's own "
                         "initialisation seed, unknown here: `mechsink experiment init_structure` "
                         "answers them on organisms",
            "evidence": "; ".join(f"{k} {v['verdict']}: {v['evidence']}"
                                  for k, v in parts.items()),
            "link": None}


def _first(verdicts: dict[str, dict[str, str]], *keys: str) -> dict[str, str] | None:
    for k in keys:
        if k in verdicts:
            return verdicts[k]
    for k, v in verdicts.items():
        if any(k.startswith(p) for p in keys):
            return v
    return None


def _cell(verdict: dict[str, str] | None, link: str | None, reason: str | None = None
          ) -> dict[str, Any]:
    if verdict is None:
        return {"verdict": "not applicable", "criterion": "-",
                "evidence": (reason or "the experiment gave no verdict for this claim").rstrip("."),
                "link": link}
    return {"verdict": verdict["verdict"], "criterion": verdict["criterion"],
            "evidence": verdict["evidence"], "link": link}


def _c2_cell(verdicts: dict[str, dict[str, str]], link: str | None, reason: str | None
             ) -> dict[str, Any]:
    """C2: the creating block's set removes the channel, and (when the structural-origin run
    validated every set against a same-size random set) which block's set carries the sink."""
    cell = _cell(verdicts.get("C2"), link, reason)
    carrier = verdicts.get("C2, the set that carries the sink")
    if carrier is None or "C2" not in verdicts:
        return cell
    both = (cell["verdict"], carrier["verdict"])
    cell["verdict"] = ("supported" if both == ("supported", "supported") else
                       "partial" if {"supported", "partial"} & set(both) else "not supported")
    cell["criterion"] = (f"supported if both hold, partial if one does: ({cell['criterion']}) "
                         f"and ({carrier['criterion']})")
    cell["evidence"] += (f"; which set carries the sink ({carrier['verdict']}): "
                         f"{carrier['evidence']}")
    cell["carrier_block"] = carrier.get("carrier_block")
    return cell


def _c3_cell(verdicts: dict[str, dict[str, str]], link: str | None, reason: str | None
             ) -> dict[str, Any]:
    """C3 from the most complete removal: the creating block's set, or (where no single block
    creates the channel and removing that set leaves the sink) every building block's sets."""
    plain, every = verdicts.get("C3"), verdicts.get("C3, every building block")
    if plain is None or every is None or plain["verdict"] != "not supported" \
            or every["verdict"] == "not supported":
        return _cell(plain, link, reason)
    cell = _cell(every, link, reason)
    cell["evidence"] = (f"every building block's sets removed: {every['evidence']} (the "
                        f"creating block's set alone: {plain['verdict']}, {plain['evidence']})")
    return cell


def _run_steps(model: Any, name: str, folder: Path, key: dict[str, Any],
               settings: dict[str, Any]) -> tuple[Any, ...]:
    """The experiments of one model (each cached in its folder), the first-token table and
    the trained model's sink rate on the claims' prompts."""
    from mechsink.experiments import p0_sink, query_bias_dose, structural_origin
    from mechsink.experiments.gpt2_query_bias import inputs
    from mechsink.model import query_bias

    n, seq_len, seed, eps, bs = (settings[k] for k in ("n", "seq_len", "seed", "eps",
                                                       "batch_size"))
    # C4's positions: two early ones and the middle (each with queries after it)
    positions = sorted({p for p in (4, 8, seq_len // 2) if 1 <= p < seq_len - 1})
    so, so_why = _step(folder / "structural_origin", key, lambda: structural_origin.run(
        model, model_name=name, n=n, seq_len=seq_len, positions=positions, batch_size=bs),
        "structural_origin")
    p0, p0_why = _step(folder / "p0_sink", key, lambda: p0_sink.run(
        model, model_name=name, n=n, seq_len=seq_len, batch_size=bs), "p0_sink")
    has_bq = any(query_bias(model, lay) is not None for lay in range(int(model.cfg.n_layers)))
    qb, qb_why = (None, "the model has no query bias (b_Q)")
    if has_bq:
        qb, qb_why = _step(folder / "query_bias_dose", key, lambda: query_bias_dose.run(
            model, model_name=name, n=n, seq_len=seq_len, rotation_seed=seed, batch_size=bs),
            "query_bias_dose")
    n_census = settings.get("n_census", n)
    first = first_token_table(model, n_census, seq_len, seed, eps, bs)
    tokens = inputs(model, name, n_census, seq_len)
    trained = _sink_rate(model, tokens, eps, bs)
    return (so, so_why), (p0, p0_why), (qb, qb_why), first, tokens, trained


def model_row(name: str, out: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Every step of the atlas on one model (loaded once, freed at the end): its column of the
    table, each cell linking ``<model folder>/<step>`` under ``out``. A model already done
    under these ``settings`` (n, seq_len, seed, eps, batch_size) is read back, no model load."""
    from mechsink.experiments.init_structure import twin_factory
    from mechsink.model import load_model

    folder = out / _slug(name)
    key = {"model": name, **settings}
    done = folder / CELLS_FILE
    if done.is_file():  # this model is done under these settings: no model load at all
        saved = json.loads(done.read_text(encoding="utf-8"))
        if saved.get("key") == key:
            return saved["row"]
    model = load_model(name)
    (so, so_why), (p0, p0_why), (qb, qb_why), first, tokens, trained = _run_steps(
        model, name, folder, key, settings)
    build_twin = twin_factory(model)
    del model
    gc.collect()
    twins = c7_twins(build_twin, settings)

    so_v = so.data["verdicts"] if so else {}
    p0_v = p0.data["verdicts"] if p0 else {}
    qb_v = qb.data["verdicts"] if qb else {}
    rel = lambda step: f"{_slug(name)}/{step}"  # noqa: E731
    cells = {
        "C1": _cell(_first(so_v, "C1"), rel("structural_origin") if so else None, so_why),
        "C2": _c2_cell(so_v, rel("structural_origin") if so else None, so_why),
        "C3": _c3_cell(so_v, rel("structural_origin") if so else None, so_why),
        "C4": _cell(_first(so_v, "C4"), rel("structural_origin") if so else None, so_why),
        "C5": _cell(_first(p0_v, "no BOS needed"), rel("p0_sink") if p0 else None, p0_why),
        "C6": _cell(_first(qb_v, "b_Q . k_0 only"), rel("query_bias_dose") if qb else None,
                    qb_why),
        "C7": c7_cell(twins),
    }
    row = {"model": name, "folder": _slug(name), "cells": cells, "first_token": first,
           "sink_rate": trained, "init_twins": twins}
    atomic_write_json(done, {"key": key, "row": row})
    return row


def check_sizes(n: int, seq_len: int) -> None:
    """The atlas's own limits on its settings, before any work."""
    if n < 2:
        raise BadInputError(f"n must be at least 2 (intervals over prompts), got {n}.")
    if seq_len < 8:
        raise BadInputError(f"seq_len must be at least 8 (positions the sink moves to), got "
                            f"{seq_len}.")


def run(*, work_dir: str | Path, models: Sequence[str] = DEFAULT_MODELS, n: int = 8,
        seq_len: int = 32, seed: int = 0, eps: float = DEFAULT_EPS,
        batch_size: int = 8, n_census: int | None = None) -> ExperimentResult:
    """Run every claim on every model under ``work_dir`` (resumable; one model in memory at a
    time) and return the atlas.

    ``models``: model names; ``n``: prompts per run; ``seq_len``: tokens per prompt; ``seed``:
    prompts, twins and bootstrap; ``eps``: the sink threshold; ``batch_size``: sequences per
    forward; ``n_census``: sequences per suite of the census-type cells (the first-token
    table, the trained model's sink rate and C7's twins; default ``n``), which cost one
    forward each and so afford more sequences than the interventions.
    """
    check_experiment_settings("atlas", locals())  # before any work, as the CLI does
    names = check_models(models)
    check_sizes(n, seq_len)
    if n_census is not None:
        check_sizes(n_census, seq_len)
    out = Path(work_dir)
    out.mkdir(parents=True, exist_ok=True)
    settings: dict[str, Any] = {"n": n, "seq_len": seq_len, "seed": seed, "eps": eps,
                                "batch_size": batch_size}
    if n_census is not None and n_census != n:  # (absent otherwise: earlier runs resume)
        settings["n_census"] = n_census
    rows = [model_row(name, out, settings) for name in names]
    result = ExperimentResult("atlas", assemble(rows, settings))
    result.save(out)
    atomic_write_text(out / "atlas.html", html_page(result.data))
    return result


def assemble(rows: Sequence[dict[str, Any]], settings: dict[str, Any],
             runs: str | None = None) -> dict[str, Any]:
    """The atlas's data from its model columns (:func:`model_row`). ``runs``: where the rows'
    run folders are relative to the atlas's own folder (None: inside it), so every cell's link
    still leads to its run."""
    if runs is not None:
        rows = [{**row, "folder": f"{runs}/{row['folder']}",
                 "cells": {claim: {**cell, "link": cell["link"] and f"{runs}/{cell['link']}"}
                           for claim, cell in row["cells"].items()}} for row in rows]
    return {"schema": SCHEMA, "settings": dict(settings), "claims": CLAIMS, "models": list(rows)}


def summary(data: dict[str, Any]) -> str:
    """The atlas as Markdown: claims x models (verdict and key figure), the criteria, and the
    first-token table."""
    s = data["settings"]
    models = data["models"]
    lines = ["# The sink atlas", "",
             f"Every claim on every model, same prompts and settings: n={s['n']} prompts of "
             f"{s['seq_len']} tokens, seed {s['seed']}, sink threshold eps={s['eps']}. Each "
             "cell links the experiment folder it was read from.", "",
             "| claim | " + " | ".join(m["model"] for m in models) + " |",
             "|---|" + "---|" * len(models)]
    for claim, what in data["claims"].items():
        cells = []
        for m in models:
            c = m["cells"][claim]
            link = f" ([run]({c['link']}/summary.md))" if c.get("link") else ""
            cells.append(f"**{c['verdict']}**{link}")
        lines.append(f"| {claim} {what} | " + " | ".join(cells) + " |")
    lines += ["", "## Criteria and evidence", ""]
    for claim in data["claims"]:
        lines.append(f"### {claim} {data['claims'][claim]}")
        lines.append("")
        for m in models:
            c = m["cells"][claim]
            lines.append(f"- {m['model']}: **{c['verdict']}**. Criterion: {c['criterion']}. "
                         f"Measured: {c['evidence']}.")
        lines.append("")
    keys = list(models[0]["first_token"]) if models else []
    lines += ["## Sink rate by prompt suite and first token", "",
              "Gu et al.'s sink rate at key 0 (fraction of heads over eps), mean [95% interval "
              "over prompts].", "",
              "| suite / first token | " + " | ".join(m["model"] for m in models) + " |",
              "|---|" + "---|" * len(models)]
    for k in keys:
        row = []
        for m in models:
            v = m["first_token"].get(k, {})
            row.append("n/a" if "mean" not in v else
                       f"{v['mean']:.3f} [{v['low']:.3f}, {v['high']:.3f}]")
        lines.append(f"| {k} | " + " | ".join(row) + " |")
    lines.append("")
    return "\n".join(lines)


def html_page(data: dict[str, Any]) -> str:
    """A self-contained HTML page of the atlas table (works offline; links to each run)."""
    models = data["models"]
    colour = {"supported": "#cdeccd", "necessary": "#cdeccd", "partial": "#fff2c2",
              "undecided": "#fff2c2", "not supported": "#f6d0d0", "dispensable": "#f6d0d0"}
    head = "".join(f"<th>{html.escape(m['model'])}</th>" for m in models)
    body = []
    for claim, what in data["claims"].items():
        cells = []
        for m in models:
            c = m["cells"][claim]
            tip = html.escape(f"Criterion: {c['criterion']}. Measured: {c['evidence']}.")
            text = html.escape(c["verdict"])
            if c.get("link"):
                text = f'<a href="{html.escape(c["link"])}/summary.md">{text}</a>'
            bg = colour.get(c["verdict"], "#eeeeee")
            cells.append(f'<td style="background:{bg}" title="{tip}">{text}</td>')
        body.append(f"<tr><th>{claim} {html.escape(what)}</th>{''.join(cells)}</tr>")
    return ("<!doctype html><meta charset='utf-8'><title>The sink atlas</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #999;padding:4px 8px;text-align:left}</style>"
            "<h1>The sink atlas</h1><p>Hover a cell for its criterion and evidence; "
            "<code>atlas.md</code> has them written out.</p>"
            f"<table><tr><th>claim</th>{head}</tr>{''.join(body)}</table>")
