"""Committed results: real-model runs kept in the repository (``docs/results/``), JSON only, so
the site shows them without running a model (figures and summaries are drawn from the JSON at
build time).

``docs/results/manifest.json`` (schema ``mechsink-docs-results/1``) holds, per result set, the
exact command and settings that made it, when it was written, the mechsink commit and version
it was made with, a digest of the experiment code it ran, where it was imported from, and the
sha256 of every committed file. ``python -m docs.build --import-results atlas FOLDER`` copies a
finished atlas (what :mod:`mechsink.experiments.atlas` writes) in; a folder that is not a
finished atlas is refused, with the reason, before anything is copied.

A build reads the committed sets as they are. When the settings the site asks for
(:data:`docs.build.plan.ATLAS`) differ from those a committed atlas was made with, the build
**refuses** (a real-model rerun takes hours: it is never started silently) and names both ways
out: ``--rerun atlas`` (rerun with the site's settings, then import) or importing a run made with
them. When only mechsink's experiment code changed since, the build says so and uses the
results (``--rerun atlas`` redoes them).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from docs.build.plan import DOCS, ROOT
from mechsink.errors import BadInputError, MechsinkError
from mechsink.io import atomic_dir, atomic_write_json

RESULTS = DOCS / "results"
MANIFEST_NAME = "manifest.json"
SCHEMA = "mechsink-docs-results/1"
ATLAS_STEPS = ("structural_origin", "p0_sink", "query_bias_dose")
STEP_MARKER = "atlas-step.json"
ATLAS_CODE = ("atlas", *ATLAS_STEPS)  # the experiment modules an atlas runs
SETTING_KEYS = ("models", "n", "seq_len", "seed", "eps", "n_census")  # what decides its numbers


class RefusedError(MechsinkError):
    """The build will not use a committed result as it is (settings differ, files changed)."""


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def experiment_code_digest(names: tuple[str, ...] = ATLAS_CODE) -> str:
    """sha256 of the experiment modules (``mechsink/experiments/<name>.py``) a result ran."""
    h = hashlib.sha256()
    for name in names:
        f = ROOT / "mechsink" / "experiments" / f"{name}.py"
        h.update(name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def git_commit(root: Path = ROOT) -> str | None:
    """The commit checked out at ``root`` (None outside git)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def read_manifest(root: Path = RESULTS) -> dict[str, Any]:
    """The committed manifest (an empty one when there is none)."""
    path = Path(root) / MANIFEST_NAME
    if not path.is_file():
        return {"schema": SCHEMA, "results": {}}
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != SCHEMA:
        raise RefusedError(f"{path} is not a {SCHEMA} manifest (schema {data.get('schema')!r}).")
    return data


# --- checking a folder before it is imported -------------------------------------------------


def _live_lock(folder: Path) -> str | None:
    """The holder of ``folder``'s write lock when that process still runs, else None."""
    from mechsink.io import LOCK_FILE

    lock = folder / LOCK_FILE
    if not lock.is_file():
        return None
    try:
        holder = json.loads(lock.read_text(encoding="utf-8"))
        pid = int(holder.get("pid"))
    except (OSError, ValueError, TypeError):
        return "an unknown process"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return f"process {pid} ({holder.get('command') or 'unknown command'})"


def _finished(folder: Path, what: str) -> None:
    from mechsink.io import check_result_set

    try:
        check_result_set(folder, full=True)
    except MechsinkError as exc:
        raise BadInputError(f"{what} is not finished: {exc}") from None


def atlas_files(src: Path) -> dict[str, Any]:
    """Check that ``src`` is a finished atlas and list what to copy: ``{"data": atlas.json's
    content, "files": [relative paths of the JSON to copy], "command", "written"}``.

    Finished means: no live writer holds its lock, its result set is whole (manifest and
    sha256s), ``atlas.json`` has the atlas schema, and every step a cell links is whole too."""
    from mechsink.experiments.atlas import CELLS_FILE, RESULT_FILE
    from mechsink.experiments.atlas import SCHEMA as ATLAS_SCHEMA

    src = Path(src)
    if not src.is_dir():
        raise BadInputError(f"{src} is not a folder: give the --out folder of a finished "
                            "`mechsink experiment atlas` run.")
    holder = _live_lock(src)
    if holder:
        raise BadInputError(f"{src} is still being written by {holder}: import it when the "
                            "atlas has finished.")
    if not (src / RESULT_FILE).is_file():
        raise BadInputError(f"{src} holds no {RESULT_FILE}: not a finished atlas (the atlas "
                            "writes it last, after every model).")
    _finished(src, f"the atlas in {src}")
    data = json.loads((src / RESULT_FILE).read_text(encoding="utf-8"))
    if data.get("schema") != ATLAS_SCHEMA:
        raise BadInputError(f"{src / RESULT_FILE} is not a {ATLAS_SCHEMA} document (schema "
                            f"{data.get('schema')!r}).")
    files = [RESULT_FILE]
    for row in data["models"]:
        folder = src / row["folder"]
        if not (folder / CELLS_FILE).is_file():
            raise BadInputError(f"{row['model']}: {folder / CELLS_FILE} is missing: the atlas "
                                "did not finish this model.")
        files.append(f"{row['folder']}/{CELLS_FILE}")
        for step in ATLAS_STEPS:
            sf = folder / step
            if not (sf / STEP_MARKER).is_file():
                continue  # a step the atlas does not run on this model (no b_Q)
            files.append(f"{row['folder']}/{step}/{STEP_MARKER}")
            if json.loads((sf / STEP_MARKER).read_text("utf-8")).get("not_applicable"):
                continue
            _finished(sf, f"{row['model']}'s {step} step ({sf})")
            files.append(f"{row['folder']}/{step}/result.json")
        for claim, cell in row["cells"].items():
            if cell.get("link") and f"{cell['link']}/result.json" not in files:
                raise BadInputError(f"{row['model']} {claim} links {cell['link']}, which holds "
                                    "no finished result.")
    source = json.loads((src / "manifest.json").read_text(encoding="utf-8"))
    steps = {}  # when each step wrote its result (a resumed atlas mixes runs)
    for rel in files:
        if rel.endswith("/result.json"):
            step = json.loads((src / rel).parent.joinpath("manifest.json").read_text("utf-8"))
            steps[rel.removesuffix("/result.json")] = step.get("written")
    return {"data": data, "files": files, "command": source.get("command"),
            "written": source.get("written"), "steps": steps}


def relative_command(command: str | None, folder: Path) -> str | None:
    """The run's command with the folder it wrote named by its own name and the program by
    its name (``/somewhere/.venv/bin/mechsink`` -> ``mechsink``): a committed manifest holds
    no path of the machine that made it."""
    if command is None:
        return None
    for form in {str(folder), str(folder.resolve())}:
        command = command.replace(form, folder.name)
    program, _, rest = command.partition(" ")
    if os.path.isabs(program) or os.sep in program:
        command = " ".join(part for part in (os.path.basename(program), rest) if part)
    return command


PREVIOUS_FILE = "previous.json"  # the verdicts of the atlas an import replaced
PREVIOUS_SCHEMA = "mechsink-atlas-previous/1"


def previous_verdicts(root: Path, name: str, settings: Mapping[str, Any]
                      ) -> dict[str, Any] | None:
    """What an import of an atlas made with ``settings`` keeps of the committed one it replaces:
    its settings, provenance and every cell's verdict, criterion and evidence, so the site can
    say which verdicts changed (a finding gone at the new settings is shown as gone). When the
    committed atlas has the same settings (a rerun), the record it kept is carried on; None
    when there is nothing to compare with."""
    from mechsink.experiments.atlas import RESULT_FILE

    entry = read_manifest(root)["results"].get(name)
    folder = Path(root) / name
    if entry is None or not (folder / RESULT_FILE).is_file():
        return None
    old = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
    same = all(list_or(old["settings"].get(k)) == list_or(settings.get(k))
               for k in SETTING_KEYS if k != "models")
    if same:
        kept = folder / PREVIOUS_FILE
        return json.loads(kept.read_text(encoding="utf-8")) if kept.is_file() else None
    return {"schema": PREVIOUS_SCHEMA, "settings": old["settings"],
            "made": entry.get("made"), "mechsink_commit": entry.get("mechsink_commit"),
            "command": entry.get("command"),
            "cells": {row["model"]: {claim: {k: cell.get(k) for k in
                                             ("verdict", "criterion", "evidence")}
                                     for claim, cell in row["cells"].items()}
                      for row in old["models"]}}


def import_atlas(src: str | Path, *, name: str = "atlas", root: Path = RESULTS,
                 commit: str | None = None) -> dict[str, Any]:
    """Copy the JSON of the finished atlas in ``src`` into ``root/name`` and record it in the
    manifest (``commit``: the mechsink commit the atlas ran at, or a sentence when a resumed
    run mixed commits; default the commit checked out here; each step's own write time is
    recorded too). Refuses a folder that is not a finished atlas before copying anything.
    Returns the manifest entry."""
    from mechsink import __version__

    src, root = Path(src).resolve(), Path(root)
    found = atlas_files(src)
    s = found["data"]["settings"]
    before = previous_verdicts(root, name, s)
    with atomic_dir(root / name, replace=True) as tmp:
        for rel in found["files"]:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, tmp / rel)
        if before is not None:
            atomic_write_json(tmp / PREVIOUS_FILE, before, sort_keys=True)
            found["files"].append(PREVIOUS_FILE)
    entry = {
        "kind": "atlas", "command": relative_command(found["command"], src),
        "settings": {"models": [m["model"] for m in found["data"]["models"]],
                     **{k: s[k] for k in SETTING_KEYS if k in s},
                     "batch_size": s.get("batch_size")},
        "made": found["written"], "steps_written": found["steps"],
        "imported": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "imported_from": src.name, "mechsink_commit": commit or git_commit(),
        "commit_source": "given at import" if commit else "the checkout that imported it",
        "mechsink_version": __version__, "experiment_code": experiment_code_digest(),
        "files": {rel: _sha256(root / name / rel) for rel in found["files"]},
    }
    manifest = read_manifest(root)
    manifest["results"][name] = entry
    atomic_write_json(root / MANIFEST_NAME, manifest, sort_keys=True)
    return entry


# --- reading committed results at build time --------------------------------------------------


@dataclass
class CommittedAtlas:
    """A committed atlas: its data, its manifest entry and where its steps are."""

    root: Path  # docs/results/<name>
    name: str
    data: dict[str, Any]
    entry: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # what the build should say about it

    @property
    def previous(self) -> dict[str, Any] | None:
        """The verdicts of the atlas this one replaced (:func:`previous_verdicts`), if kept."""
        path = self.root / PREVIOUS_FILE
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def step(self, row: Mapping[str, Any], step: str) -> Path | None:
        """The folder of ``step`` for a model row when it holds a result, else None."""
        folder = self.root / row["folder"] / step
        return folder if (folder / "result.json").is_file() else None


def settings_difference(entry: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """The settings (of :data:`SETTING_KEYS`) where a committed atlas and the site differ."""
    have = entry["settings"]
    return [f"{k}: committed {have.get(k)!r}, the site asks {wanted.get(k)!r}"
            for k in SETTING_KEYS if k in wanted and list_or(have.get(k)) != list_or(wanted[k])]


def list_or(v: Any) -> Any:
    return list(v) if isinstance(v, list | tuple) else v


def load_atlas(wanted: Mapping[str, Any] | None, root: Path = RESULTS,
               name: str = "atlas") -> CommittedAtlas | None:
    """The committed atlas (None when none is committed), checked: every file as recorded
    (a changed file is refused) and made with the ``wanted`` settings (else refused)."""
    from mechsink.experiments.atlas import RESULT_FILE

    entry = read_manifest(root)["results"].get(name)
    if entry is None:
        return None
    folder = Path(root) / name
    for rel, digest in entry["files"].items():
        path = folder / rel
        if not path.is_file() or _sha256(path) != digest:
            raise RefusedError(f"{path} differs from {Path(root) / MANIFEST_NAME} (edited or "
                               f"missing since it was imported): restore it (git checkout "
                               f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path})"
                               " or import the atlas again.")
    differ = settings_difference(entry, wanted or {})
    if differ:
        raise RefusedError(
            f"the committed {name} ({folder}) was made with other settings than the site asks "
            f"for ({'; '.join(differ)}). Rerun it with the site's settings (`python -m "
            f"docs.build --rerun {name}`: real models, hours) or import an atlas made with them "
            f"(`python -m docs.build --import-results {name} FOLDER`).")
    data = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
    atlas = CommittedAtlas(folder, name, data, entry)
    if entry.get("experiment_code") != experiment_code_digest():
        atlas.notes.append(f"the committed {name} was made by other experiment code (mechsink "
                           f"{entry.get('mechsink_commit', '?')[:12]}); it is shown as made. "
                           f"`python -m docs.build --rerun {name}` redoes it.")
    return atlas


def rerun_atlas(wanted: Mapping[str, Any], work: Path, root: Path = RESULTS,
                name: str = "atlas") -> dict[str, Any]:
    """Run the atlas with the site's settings into ``work`` (resumable: an interrupted rerun
    picks up where it stopped) and import it. Runs real models: hours."""
    from mechsink.experiments.atlas import run

    settings = {k: (list(v) if isinstance(v, tuple) else v) for k, v in wanted.items()}
    run(work_dir=work, **settings)
    return import_atlas(work, name=name, root=root)


#: what a committed census extract keeps of a run (the pages on secondary sinks and on dormant
#: heads read these; the rest of census.json, patterns and per-layer tables, stays out)
CENSUS_EXTRACT_SCHEMA = "mechsink-docs-census-extract/1"
SECONDARY_EXAMPLES = 5
VALUE_SHARE_HEADS = 10


def census_extract(census: Mapping[str, Any], command: str) -> dict[str, Any]:
    """The secondary sinks and the value-weighted sink share of every run of a ``census.json``
    (``mechsink scan``'s), with its settings and ``command``: small enough to commit."""
    runs = []
    for r in census["runs"]:
        secondary = dict(r.get("secondary_sinks") or {})
        secondary.pop("top_score", None)  # a [layer, position] table: the census keeps it
        secondary["examples"] = list(secondary.get("examples") or [])[:SECONDARY_EXAMPLES]
        heads = sorted(r.get("sink_heads_value_share") or [],
                       key=lambda h: -float(h.get("dormant_fraction") or 0.0))
        runs.append({
            "suite": r["suite"], "variant": r["variant"], "n": r["n"], "seq_len": r["seq_len"],
            "sink_rate": r.get("sink_rate"), "secondary_sinks": secondary,
            "value_share": {"rule": r.get("value_share_rule"),
                            "sink_heads": len(r.get("sink_heads_value_share") or []),
                            "dormant_share": r.get("sink_heads_dormant_share"),
                            "mostly_dormant": r.get("sink_heads_mostly_dormant"),
                            "heads": heads[:VALUE_SHARE_HEADS]}})
    return {"schema": CENSUS_EXTRACT_SCHEMA, "model": census["model"],
            "mechsink_version": census.get("mechsink_version"), "command": command,
            "settings": census["settings"], "runs": runs}


def write_census_extract(census_json: str | Path, command: str, root: Path = RESULTS) -> Path:
    """Write :func:`census_extract` of ``census_json`` to ``root/census/<model>.json``."""
    data = json.loads(Path(census_json).read_text(encoding="utf-8"))
    out = root / "census" / f"{str(data['model']).replace(':', '_').replace('/', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, census_extract(data, command))
    return out
