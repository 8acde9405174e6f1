"""One model's column of the atlas as a job: the sweep's ``atlas`` table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mechsink import settings
from mechsink.jobs.spec import NUM, at, from_settings, setting, sweep_name, sweep_table

#: the atlas job's run folders, beside its merged table (OUT/atlas)
RUNS = "atlas-runs"


@dataclass(frozen=True)
class Spec:
    """The prompts and threshold every model of the atlas is measured with."""

    n: int = setting(8, (int,), "prompts per run")
    seq_len: int = setting(32, (int,), "tokens per prompt")
    seed: int = setting(0, (int,), "prompts, twins and bootstrap")
    eps: float | int = setting(settings.DEFAULT_EPS, NUM, "the sink threshold")
    batch_size: int = setting(8, (int,), "sequences per forward")


TABLE = sweep_table(Spec)


def check(spec: Spec, models: Sequence[str] = (),
          option: Callable[[str], str] = sweep_name) -> None:
    """Every value and the model names (``models``), before any model loads."""
    from mechsink.experiments import atlas

    at("n", atlas.check_sizes, spec.n, 8)
    at("seq_len", atlas.check_sizes, 2, spec.seq_len)
    at("eps", settings.check_eps, spec.eps, option("eps"))
    at("batch_size", settings.check_batch_size, spec.batch_size, option("batch_size"))
    at("models", atlas.check_models, list(models), table=None)


def run(name: str, spec: Spec, work_dir: Path) -> dict[str, Any]:
    """The column of model ``name``; its run folders go under ``work_dir``."""
    from mechsink.experiments.atlas import model_row

    return model_row(name, work_dir, asdict(spec))


def run_shard(model: Callable[[], Any], shard: dict[str, Any]) -> dict[str, Any]:
    """A sweep shard: one model's column (the atlas loads the model itself, and its
    random-init twins); its run folders go to the shard's ``work_dir``."""
    return run(_atlas_name(shard["model"]), from_settings(Spec, shard["settings"]),
               Path(shard["work_dir"]))


def _atlas_name(ref: dict[str, Any]) -> str:
    """The model's name in the atlas: as the spec writes it for a zoo name or a bundled
    organism (so a direct ``atlas.run`` of that name shares its runs), else the resolved path."""
    from mechsink.model.zoo import organism_folder

    prefix, _, rest = ref["label"].partition(":")
    if ref["label"] == ref["load"] or (
            prefix == "organism" and f"organism:{organism_folder(rest).resolve()}" == ref["load"]
            and not Path(rest).exists()):
        return ref["label"]
    return ref["load"]


def merge(table: dict[str, Any], done: list, missing: list[str], folder: Path) -> list[Path]:
    """The atlas table of the finished models (spec order), its links into ``OUT/atlas-runs``."""
    from mechsink.experiments.atlas import RESULT_FILE, assemble, html_page, summary
    from mechsink.io import atomic_write_text
    from mechsink.jobs.files import json_text

    data = assemble([r for _, r in done], table, runs=f"../{RUNS}")
    data["missing"] = missing
    return [atomic_write_text(folder / RESULT_FILE, json_text({"experiment": "atlas", **data})),
            atomic_write_text(folder / "summary.md", summary(data)),
            atomic_write_text(folder / "atlas.html", html_page(data))]
