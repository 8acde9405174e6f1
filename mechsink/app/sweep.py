"""Sweeps: one job of :mod:`mechsink.jobs` (census, timeline point, activation patching, an
experiment, the atlas, circuit discovery) over many models, checkpoints or prompt pairs, split
into shards, run locally or on Ray, merged into one result.

A sweep is a TOML spec (see ``docs/tutorials/sweep.md``)::

    models = ["random:gpt2-tiny", {name = "random:gpt2-mini", seed = 1}, "organism:bb-gpt2-tiny"]
    training_runs = ["runs/a"]     # every checkpoint (step-N) of each training run folder
    jobs = ["census"]              # census | timeline | patch | experiment | atlas | discover
    threads = 1                    # torch threads per shard (fixed, so results are bit-equal)

    [census]
    n = 4
    seq_len = 32

Each shard (one model; for ``patch``, one model x a slice of prompt pairs) is written atomically
to ``OUT/shards/<id>.json``; a rerun skips the shards already written, so a killed sweep resumes.
A shard that raises is recorded in ``OUT/summary.json`` and the others go on. The merged results
(``OUT/<job>/...``, JSON with sorted keys; each job's folder one result set with its
``manifest.json``) depend only on the spec: they are byte-identical (the manifests' time stamps
aside) whether the shards ran in this process, on Ray workers, or over several resumed runs.
Timings, hosts and failures live in ``summary.json`` only.

With Ray (``ray=True``), each worker is an actor that keeps one loaded model, and the driver hands
a worker the shards of one model in a row. Every node loads models from its own
``$MECHSINK_CACHE``: share that folder between nodes or fill it on each node beforehand (load
each model once there); a worker that finds a zoo model missing fails that shard saying so.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import socket
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechsink.errors import BadInputError, MechsinkError, MissingDependencyError
from mechsink.io import (
    atomic_write_json,
    full_disk_is_one_line,
    json_text,
    result_set,
)
from mechsink.jobs import JOBS
from mechsink.jobs import job as jobs_module
from mechsink.jobs.atlas import RUNS as ATLAS_RUNS
from mechsink.jobs.files import MERGED_SCHEMA  # noqa: F401 (the merged files' schema)
from mechsink.jobs.spec import SettingError, from_settings, required

SUMMARY_SCHEMA = "mechsink-sweep-summary/1"
TOP_KEYS = {"models": list, "training_runs": list, "jobs": list, "device": str, "threads": int}


def _table(job: str) -> dict[str, tuple[tuple[type, ...], Any]]:
    """The settings job ``job``'s table takes: name -> (accepted types, default), read off
    the job's spec (:mod:`mechsink.jobs`; discover's adds the methods' options)."""
    return dict(jobs_module(job).TABLE)


# --- the spec ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRef:
    """A model of the sweep: ``label`` as the spec writes it, ``load`` what the zoo loads."""

    label: str
    load: str
    seed: int | None = None
    meta: tuple[tuple[str, Any], ...] = ()  # step and loss of a training checkpoint

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "load": self.load, "seed": self.seed, "meta": dict(self.meta)}


@dataclass(frozen=True)
class Spec:
    """A parsed, checked sweep spec."""

    path: Path
    models: tuple[ModelRef, ...]
    jobs: tuple[str, ...]
    settings: dict[str, dict[str, Any]]
    device: str
    threads: int
    pairs: tuple[tuple[str, str], ...] = ()


def _read_utf8(path: Path, what: str) -> str:
    """The text of ``path``; bytes that are not UTF-8 are one line naming the file and where."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise BadInputError(f"{what} {path}, line {line}: byte {data[exc.start]:#04x} is not "
                            "UTF-8: save the file as UTF-8 text.") from None


def _line(text: str, table: str | None, key: str | None = None, value: str | None = None) -> int:
    """The 1-based line of ``key`` (or of the string ``value``) inside ``[table]`` of TOML
    ``text`` (tomllib gives no positions); 1 when not found."""
    current: str | None = None
    key_line = None
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0] if '"' not in raw and "'" not in raw else raw
        head = re.match(r"\s*\[+\s*([^\]]+?)\s*\]+\s*(#.*)?$", line)
        if head:
            current = head.group(1)
            continue
        if current != table:
            continue
        if value is not None and (f'"{value}"' in line or f"'{value}'" in line):
            return i
        if key is not None and key_line is None and re.match(rf"\s*\"?{re.escape(key)}\"?\s*=",
                                                             line):
            key_line = i
            if value is None:
                return i
    return key_line or 1


def _where(spec: Path, text: str, table: str | None, key: str | None = None,
           value: str | None = None) -> str:
    return f"{spec}, line {_line(text, table, key, value)}"


def _check_model_name(name: str, base: Path) -> str:
    """The name the zoo loads for ``name`` (folders resolved against the spec's folder);
    a :class:`BadInputError` (its message) when the zoo cannot know it."""
    from mechsink.model.zoo import NAMED_MODELS, organism_folder, random_config

    if name in NAMED_MODELS:
        return name
    prefix, _, rest = name.partition(":")
    if prefix == "random" and rest:
        random_config(rest)  # raises UnknownModelError for a bad family or size
        return name
    if prefix == "organism" and rest:
        given = Path(rest) if Path(rest).is_absolute() else base / rest
        folder = given if given.exists() else organism_folder(rest)  # else a bundled name
        if not (folder / "config.json").is_file():
            raise BadInputError(f"organism {rest!r} not found: {given} (the path taken relative "
                                "to the spec's folder) holds no config.json, and no organism "
                                "bundled with mechsink has that name.")
        return f"organism:{folder.resolve()}"
    raise BadInputError(f"unknown model {name!r}: give a zoo name ({', '.join(NAMED_MODELS)}), "
                        "random:gpt2-<size>, random:llama-<size> or organism:<folder>")


def _checkpoints(run: Path) -> list[tuple[int, float | None]]:
    data = json.loads((run / "run.json").read_text(encoding="utf-8"))
    losses = data.get("losses", [])
    return [(int(s), losses[s - 1] if 0 < s <= len(losses) else None)
            for s in data["checkpoints"] if (run / f"step-{s}").is_dir()]


def load_spec(path: str | Path) -> Spec:
    """Parse and check a sweep spec before any work: an unknown model, job or setting, or a
    value of the wrong type, is a :class:`BadInputError` naming the spec's line."""
    from mechsink import settings as checks

    spec = Path(path)
    if not spec.is_file():
        raise BadInputError(f"sweep spec {spec} not found: give the path of a TOML file.")
    text = _read_utf8(spec, "sweep spec")
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise BadInputError(f"{spec} is not valid TOML: {exc}") from None
    base = spec.parent.resolve()
    for key, value in raw.items():
        if key in JOBS:
            continue
        if key not in TOP_KEYS:
            raise BadInputError(f"{_where(spec, text, None, key)}: unknown setting {key!r}; a "
                                f"spec has {', '.join(TOP_KEYS)} and the tables "
                                f"[{'], ['.join(JOBS)}].")
        if not isinstance(value, TOP_KEYS[key]) or isinstance(value, bool):
            raise BadInputError(f"{_where(spec, text, None, key)}: {key} must be a "
                                f"{TOP_KEYS[key].__name__}, got {value!r}.")
    jobs = raw.get("jobs", [])
    if not jobs:
        raise BadInputError(f"{_where(spec, text, None, 'jobs')}: give jobs = [...], one or more "
                            f"of {', '.join(JOBS)}.")
    for job in jobs:
        if job not in JOBS:
            raise BadInputError(f"{_where(spec, text, None, 'jobs', str(job))}: unknown job "
                                f"{job!r}: choose from {', '.join(JOBS)}.")
        if jobs.count(job) > 1:
            raise BadInputError(f"{_where(spec, text, None, 'jobs')}: job {job!r} is listed "
                                "twice.")
    settings: dict[str, dict[str, Any]] = {}
    for job in JOBS:
        given = raw.get(job, {})
        if not isinstance(given, dict):
            raise BadInputError(f"{_where(spec, text, None, job)}: {job} must be a table [{job}].")
        if given and job not in jobs:
            raise BadInputError(f"{_where(spec, text, job, next(iter(given)))}: settings for "
                                f"job {job!r}, which jobs = [...] does not list.")
        known = _table(job)
        out = {}
        for key, value in given.items():
            if key not in known:
                raise BadInputError(f"{_where(spec, text, job, key)}: unknown setting {key!r} in "
                                    f"[{job}]: known are {', '.join(known)}.")
            types = known[key][0]
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                raise BadInputError(f"{_where(spec, text, job, key)}: [{job}] {key} must be "
                                    f"{' or '.join(t.__name__ for t in types)}, got {value!r}.")
            out[key] = value
        needed = required(jobs_module(job).Spec)
        for key, (_, default) in known.items():
            if key not in out:
                if key in needed and job in jobs:
                    raise BadInputError(f"{_where(spec, text, job)}: [{job}] needs {key} = ...")
                out[key] = copy.deepcopy(default)
        settings[job] = out
    pairs: tuple[tuple[str, str], ...] = ()
    if "patch" in jobs:
        pairs = _read_pairs(spec, text, base / settings["patch"]["pairs"])
        if settings["patch"]["pairs_per_shard"] < 1:
            raise BadInputError(f"{_where(spec, text, 'patch', 'pairs_per_shard')}: "
                                "pairs_per_shard must be positive.")
    if "experiment" in jobs:
        from mechsink.jobs import experiment

        _at_line(spec, text, experiment.prepare, settings["experiment"], base)
    models = _models(spec, text, raw, base)
    _check_values(spec, text, jobs, settings, pairs, models, raw.get("device", "cpu"))
    if not models and not ("experiment" in jobs and not _takes_model(settings["experiment"])):
        raise BadInputError(f"{_where(spec, text, None, 'models')}: no models: give models = "
                            "[...] or training_runs = [...].")
    threads = raw.get("threads", 1)
    try:
        checks.check_threads(threads)  # more would only spawn threads that wait for a core
    except MechsinkError as exc:
        raise BadInputError(f"{_where(spec, text, None, 'threads')}: {exc}") from None
    return Spec(spec, tuple(models), tuple(jobs), settings, raw.get("device", "cpu"), threads,
                pairs)


def _models(spec: Path, text: str, raw: dict[str, Any], base: Path) -> list[ModelRef]:
    models: list[ModelRef] = []
    for entry in raw.get("models", []):
        name, seed = entry, None
        if isinstance(entry, dict):
            extra = set(entry) - {"name", "seed"}
            if "name" not in entry or extra:
                raise BadInputError(f"{_where(spec, text, None, 'models')}: a model table takes "
                                    f"name and seed, got {sorted(entry)}.")
            name, seed = entry["name"], entry.get("seed")
        if not isinstance(name, str) or (seed is not None and not isinstance(seed, int)):
            raise BadInputError(f"{_where(spec, text, None, 'models')}: a model is a name or "
                                f"{{name = ..., seed = N}}, got {entry!r}.")
        if seed is not None and not name.startswith("random:"):
            raise BadInputError(f"{_where(spec, text, None, 'models', name)}: seed only applies "
                                f"to random:... models, not {name!r}.")
        try:
            load = _check_model_name(name, base)
        except MechsinkError as exc:
            raise BadInputError(f"{_where(spec, text, None, 'models', name)}: {exc}") from None
        label = name if seed is None else f"{name}@seed{seed}"
        models.append(ModelRef(label, load, seed))
    for run in raw.get("training_runs", []):
        if not isinstance(run, str):
            raise BadInputError(f"{_where(spec, text, None, 'training_runs')}: a training run "
                                f"is a folder path, got {run!r}.")
        folder = (Path(run) if Path(run).is_absolute() else base / run).resolve()
        if not (folder / "run.json").is_file():
            raise BadInputError(f"{_where(spec, text, None, 'training_runs', run)}: "
                                f"{folder} holds no run.json: give a training run folder.")
        shown = run.rstrip("/") or run
        for step, loss in _checkpoints(folder):
            models.append(ModelRef(f"{shown}/step-{step}", f"organism:{folder / f'step-{step}'}",
                                   None, (("loss", loss), ("run", shown), ("step", step))))
    # duplicates by what is loaded (resolved folders: ``../org`` and ``../org/``, relative and
    # absolute spellings, are one model), not by how the spec spells them
    seen: dict[tuple[str, int | None], str] = {}
    for m in models:
        key = (m.load, m.seed)
        if key in seen:
            same = "" if seen[key] == m.label else f" (as {seen[key]!r} and {m.label!r})"
            raise BadInputError(f"{_where(spec, text, None, 'models', m.label)}: model "
                                f"{m.label!r} is listed twice{same}.")
        seen[key] = m.label
    return models


def _read_pairs(spec: Path, text: str, path: Path) -> tuple[tuple[str, str], ...]:
    """Prompt pairs from a JSON-lines file: one ``{"clean": ..., "corrupted": ...}`` a line."""
    where = _where(spec, text, "patch", "pairs")
    if not path.is_file():
        raise BadInputError(f"{where}: prompt-pair file {path} not found.")
    pairs = []
    for i, line in enumerate(_read_utf8(path, "prompt-pair file").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            pair = (item["clean"], item["corrupted"])
        except (ValueError, KeyError, TypeError):
            raise BadInputError(f"{path}, line {i}: want a JSON object with \"clean\" and "
                                f"\"corrupted\" strings (named at {where}).") from None
        for key, prompt in zip(("clean", "corrupted"), pair, strict=True):
            if not isinstance(prompt, str):  # never coerced: 12 is not the text "12"
                raise BadInputError(f"{path}, line {i}: \"{key}\" must be a string (the "
                                    f"prompt's text in quotes), got {json.dumps(prompt)} (named "
                                    f"at {where}).")
        pairs.append(pair)
    if not pairs:
        raise BadInputError(f"{where}: {path} holds no prompt pairs.")
    return tuple(pairs)


def _at_line(spec: Path, text: str, check: Callable[..., Any], *args: Any,
             job: str | None = None) -> Any:
    """Run a job's ``check``; a :class:`~mechsink.jobs.spec.SettingError` becomes one line
    naming the spec's line of the setting it is about."""
    try:
        return check(*args)
    except SettingError as exc:
        table = job if exc.table == "" else exc.table
        where = _where(spec, text, table, exc.key)
        text_of = str(exc) if exc.bare else f"[{table or 'spec'}] {exc}"
        raise BadInputError(f"{where}: {text_of}") from None


#: the order the jobs' values are checked in (the first bad one is reported)
_CHECK_ORDER = ("census", "timeline", "patch", "atlas", "experiment", "discover")


def _check_values(spec: Path, text: str, jobs: Sequence[str], settings: dict[str, dict[str, Any]],
                  pairs: Sequence[tuple[str, str]], models: Sequence[ModelRef],
                  device: str) -> None:
    """Every value through its job's ``check`` (the checks and messages the CLI uses), against
    each model's config and tokenizer, before any model loads; a bad one names the spec's
    line."""
    from mechsink import settings as checks
    from mechsink.jobs.spec import at

    _at_line(spec, text, at, "device", checks.check_device, device, job=None)
    loads = sorted({m.load for m in models})
    for job in _CHECK_ORDER:
        if job not in jobs:
            continue
        module = jobs_module(job)
        given = from_settings(module.Spec, settings[job])
        extra = (pairs,) if job == "patch" else ()
        _at_line(spec, text, module.check, given, loads, *extra, job=job)
        if job == "atlas" and any(m.seed is not None or m.meta for m in models):
            raise BadInputError(f"{_where(spec, text, None, 'models')}: the atlas job takes "
                                "model names only (no seed = ..., no training_runs): its "
                                "random-init twins and prompts follow [atlas] seed.")


def _takes_model(table: dict[str, Any]) -> bool:
    from mechsink.jobs import experiment

    return experiment.takes_model(table)


# --- shards ------------------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[-60:] or "model"


def make_shards(spec: Spec) -> list[dict[str, Any]]:
    """Every shard of the sweep, in merge order. A shard is a plain dict (it travels to Ray
    workers): ``id`` (stable for the same spec), ``job``, ``model``, ``settings``."""
    shards = []
    for job in spec.jobs:
        module = jobs_module(job)
        settings = spec.settings[job]
        models: Sequence[ModelRef | None] = spec.models
        if not getattr(module, "takes_model", lambda table: True)(settings):
            models = [None]
        split = getattr(module, "shard_parts", None)  # a job that splits a model's work
        parts = [("", dict(settings))] if split is None else split(settings, spec.pairs)
        for model in models:
            for suffix, part in parts:
                shard = {"job": job, "model": None if model is None else model.to_dict(),
                         "settings": part, "device": spec.device, "threads": spec.threads}
                digest = hashlib.sha256(json.dumps(shard, sort_keys=True).encode()).hexdigest()
                name = "none" if model is None else _slug(model.label)
                shard["id"] = f"{job}--{name}{suffix}--{digest[:10]}"
                shards.append(shard)
    return shards


class ShardWorker:
    """Runs shards one at a time, keeping the last loaded model (a Ray actor, or in-process).

    ``remote=True`` (a Ray worker): a zoo model missing from this node's cache is an error
    saying so, instead of a conversion on the node.
    """

    def __init__(self, remote: bool = False, name: str = "local") -> None:
        self.remote = remote
        self.name = name
        self._key: tuple[str, int | None, str] | None = None
        self._model: Any = None

    def model(self, ref: dict[str, Any], device: str) -> Any:
        """The model of ``ref``, loaded once per run of shards of the same model."""
        key = (ref["load"], ref["seed"], device)
        if key != self._key:
            self._model = self._key = None  # free the old model first
            self._check_available(ref["load"])
            from mechsink.model.zoo import load_model

            self._model = load_model(ref["load"], device=device, seed=ref["seed"])
            self._key = key
        return self._model

    def _check_available(self, load: str) -> None:
        from mechsink.model.assets import cache_dir
        from mechsink.model.zoo import NAMED_MODELS

        host = socket.gethostname()
        if load.startswith("organism:") and not Path(load.partition(":")[2]).exists():
            raise MechsinkError(f"organism folder {load.partition(':')[2]} does not exist on "
                                f"{host}: put it on a filesystem every node shares.")
        if self.remote and load in NAMED_MODELS and not NAMED_MODELS[load].is_cached():
            raise MechsinkError(
                f"{load} is not in the model cache {cache_dir()} (MECHSINK_CACHE) on {host}: "
                "share that folder between the nodes, or fill it on each node first "
                f"(python -c \"import mechsink; mechsink.load_model('{load}')\").")

    def run(self, shard: dict[str, Any]) -> dict[str, Any]:
        """Run one shard; never raises: a failure comes back as ``status: failed``."""
        import torch

        start = time.perf_counter()
        info = {"host": socket.gethostname(), "pid": os.getpid(), "worker": self.name}
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(shard["threads"])
            result = _JOB_RUNNERS[shard["job"]](self, shard)
            # a JSON round trip: what a resumed sweep reads back is what this run merges
            # (strict: a non-finite number comes back null with a reason beside it)
            result = json.loads(json_text(result, indent=None, sort_keys=True))
            return {"status": "ok", "result": result, **info,
                    "seconds": time.perf_counter() - start}
        except Exception as exc:  # a shard's failure is data for the summary
            return {"status": "failed", "error": f"{type(exc).__name__}: {exc}", **info,
                    "seconds": time.perf_counter() - start}
        finally:
            torch.set_num_threads(threads)


def _runner(job: str) -> Callable[[ShardWorker, dict[str, Any]], dict[str, Any]]:
    """Job ``job``'s shard runner: its ``run_shard``, handed the worker's model of the shard
    (loaded on first use, kept for the next shard of the same model)."""

    def run(worker: ShardWorker, shard: dict[str, Any]) -> dict[str, Any]:
        return jobs_module(job).run_shard(
            lambda: worker.model(shard["model"], shard["device"]), shard)

    return run


_JOB_RUNNERS: dict[str, Callable[[ShardWorker, dict[str, Any]], dict[str, Any]]] = {
    job: _runner(job) for job in JOBS}


# --- running -----------------------------------------------------------------------------------


def _by_model(shards: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Shards grouped by the model they load (first-seen order), so a worker loads each once."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for shard in shards:
        key = json.dumps(shard["model"], sort_keys=True)
        groups.setdefault(key, []).append(shard)
    return list(groups.values())


Record = Callable[[dict[str, Any], dict[str, Any]], None]


def _run_local(todo: list[dict[str, Any]], record: Record, limit: int | None) -> None:
    worker = ShardWorker()
    ran = 0
    for group in _by_model(todo):
        for shard in group:
            if limit is not None and ran >= limit:
                return
            record(shard, worker.run(shard))
            ran += 1


def _run_ray(todo: list[dict[str, Any]], record: Record, limit: int | None, workers: int,
             address: str | None) -> str:
    """Run ``todo`` on Ray actors (one model kept in each); returns where it ran."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError("--ray needs the ray package: pip install "
                                     "'mechsink[ray]'.") from None
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                     configure_logging=False)
    where = f"ray {address}" if address else f"local ray, {workers} workers"
    try:
        actor = ray.remote(num_cpus=1)(ShardWorker)
        actors = [actor.remote(remote=True, name=f"ray-{i}") for i in range(workers)]
        groups = deque(_by_model(todo))
        queues: list[deque[dict[str, Any]]] = [deque() for _ in actors]
        inflight: dict[Any, tuple[int, dict[str, Any]]] = {}
        submitted = 0

        def submit(i: int) -> None:
            nonlocal submitted
            if limit is not None and submitted >= limit:
                return
            if not queues[i]:
                if not groups:
                    return
                queues[i] = deque(groups.popleft())
            shard = queues[i].popleft()
            inflight[actors[i].run.remote(shard)] = (i, shard)
            submitted += 1

        for i in range(len(actors)):
            submit(i)
        while inflight:
            (ref,), _ = ray.wait(list(inflight), num_returns=1)
            i, shard = inflight.pop(ref)
            try:
                outcome = ray.get(ref)
            except Exception as exc:  # the actor died (out of memory, node lost)
                outcome = {"status": "failed", "error": f"{type(exc).__name__}: {exc}",
                           "host": None, "pid": None, "worker": f"ray-{i}", "seconds": None}
            record(shard, outcome)
            submit(i)
    finally:
        if started_here:
            ray.shutdown()
    return where


RAY_PROBE_S = 3.0  # a cluster's head answers a TCP connect at once; nothing there fails fast


def check_ray_address(address: str, timeout: float = RAY_PROBE_S) -> None:
    """Something answers at ``address`` (``host:port``, ``ray://host:port``; ``auto`` and
    ``local`` are left to Ray): one TCP connect with a short timeout before ``ray.init``, which
    would otherwise retry for minutes printing its logs."""
    if address in ("auto", "local"):
        return
    where = address.split("://", 1)[-1]
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInputError(f"--ray-address {address!r} is not HOST:PORT (e.g. 10.0.0.5:6379, "
                            "the head node's address that `ray start --head` prints).")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise BadInputError(
            f"--ray-address {address}: nothing answers there ({reason}, {timeout:g} s): start "
            "the cluster first (ray start --head on the head node) and give the address it "
            "prints, or leave out --ray-address (--ray runs a local Ray instance).") from None


def shard_path(out: Path, shard: dict[str, Any]) -> Path:
    return out / "shards" / f"{shard['id']}.json"


def _read_shard(out: Path, shard: dict[str, Any]) -> dict[str, Any] | None:
    """A finished shard's file, or None (missing, unreadable, or written for another spec)."""
    path = shard_path(out, shard)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    same = json.dumps(data.get("shard"), sort_keys=True) == json.dumps(shard, sort_keys=True)
    return data if same else None



def run_sweep(spec_path: str | Path, out: str | Path, *, ray: bool = False,
              ray_address: str | None = None, workers: int = 2,
              max_shards: int | None = None) -> dict[str, Any]:
    """Run the sweep of ``spec_path`` into ``out`` and merge; returns the summary.

    Shards already in ``out/shards`` are skipped; ``max_shards`` stops after that many shards
    ran (the merge then holds what is done so far). ``ray``: on Ray (a local instance of
    ``workers`` CPUs, or the cluster at ``ray_address``).
    """
    from mechsink.io import check_no_links, check_writable, folder_lock

    spec = load_spec(spec_path)
    if isinstance(workers, bool) or workers < 1:
        raise BadInputError(f"workers must be a positive integer, got {workers!r}.")
    if max_shards is not None and max_shards < 0:
        raise BadInputError(f"max_shards must be 0 or more, got {max_shards}.")
    if ray_address is not None:
        check_ray_address(ray_address)
    folder = check_writable(out)
    check_no_links(folder, ["shards", ATLAS_RUNS, *spec.jobs])
    shards = make_shards(spec)
    for shard in shards:  # where the atlas's runs live: beside its table, not in the shard's id
        if shard["job"] == "atlas":
            shard["work_dir"] = str((folder / ATLAS_RUNS).resolve())
    start = time.perf_counter()
    with folder_lock(folder, command=f"mechsink sweep {spec.path}"), full_disk_is_one_line(
            folder, kept="the shards already written are kept, and a rerun resumes from them"):
        (folder / "shards").mkdir(parents=True, exist_ok=True)
        records: dict[str, dict[str, Any]] = {}
        todo = []
        for shard in shards:
            done = _read_shard(folder, shard)
            if done is None:
                todo.append(shard)
            else:
                records[shard["id"]] = {"status": "skipped", **done["run"]}

        def record(shard: dict[str, Any], outcome: dict[str, Any]) -> None:
            run = {k: v for k, v in outcome.items() if k not in ("status", "result")}
            if outcome["status"] == "ok":
                atomic_write_json(shard_path(folder, shard), {"shard": shard, "run": run,
                                                              "result": outcome["result"]},
                                  sort_keys=True)
                records[shard["id"]] = {"status": "ran", **run}
            else:
                records[shard["id"]] = {"status": "failed", **run}

        if ray and todo:
            where = _run_ray(todo, record, max_shards, workers, ray_address)
        else:
            _run_local(todo, record, max_shards)
            where = "local process"
        merged = merge(spec, shards, folder)
        rows = []
        for shard in shards:
            rec = records.get(shard["id"], {"status": "not run"})
            model = shard["model"]["label"] if shard["model"] else None
            rows.append({"id": shard["id"], "job": shard["job"], "model": model,
                         "error": None, **rec})
        summary = {
            "schema": SUMMARY_SCHEMA, "spec": str(spec.path), "backend": where,
            "ray_address": ray_address, "wall_s": time.perf_counter() - start,
            "ran": sum(r["status"] == "ran" for r in rows),
            "skipped": sum(r["status"] == "skipped" for r in rows),
            "failed": sum(r["status"] == "failed" for r in rows),
            "not_run": sum(r["status"] == "not run" for r in rows),
            "merged": merged, "shards": rows,
        }
        atomic_write_json(folder / "summary.json", summary, sort_keys=True)
    return summary


# --- merging -----------------------------------------------------------------------------------


def merge(spec: Spec, shards: list[dict[str, Any]], out: Path) -> list[str]:
    """Merge the finished shards into ``out/<job>/``, each folder one result set
    (:func:`mechsink.io.result_set`: whole or the previous one), by each job's ``merge``;
    returns the files written. Everything written depends on the spec and the shard results
    only (no timings), in spec order."""
    written: list[str] = []
    for job in spec.jobs:
        mine = [s for s in shards if s["job"] == job]
        done = [(s, d["result"]) for s in mine if (d := _read_shard(out, s)) is not None]
        missing = sorted({s["model"]["label"] if s["model"] else s["id"] for s in mine
                          if _read_shard(out, s) is None})
        with result_set(out / job, command=f"mechsink sweep {spec.path}") as staging:
            files = jobs_module(job).merge(spec.settings[job], done, missing, staging)
            written += [f"{job}/{p.relative_to(staging)}" for p in files]
    return written
