"""An experiment of :mod:`mechsink.experiments` as a job: ``mechsink experiment NAME`` and the
sweep's ``experiment`` table (``name`` and ``[experiment.settings]``, ``run()``'s keywords)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechsink.errors import MechsinkError
from mechsink.jobs.spec import SettingError, from_settings, setting, sweep_table

SETTINGS_TABLE = "experiment.settings"
NOT_SETTINGS = ("model_name", "work_dir")  # the model argument; --out


@dataclass(frozen=True)
class Spec:
    """The experiment's name and the settings given (over ``run()``'s defaults)."""

    name: str | None = setting(None, (str,), "the experiment", required=True)
    settings: dict[str, Any] = field(default_factory=dict,
                                     metadata={"types": (dict,), "help": "run()'s keywords",
                                               "sweep": True, "required": False})


TABLE = {k: (t, {} if k == "settings" else d) for k, (t, d) in sweep_table(Spec).items()}


def prepare(table: dict[str, Any], base: Path) -> None:
    """The experiment exists, can run as a job (it needs no work folder of its own) and knows
    every setting given; a ``run_dir`` is taken relative to ``base`` (the spec's folder)."""
    from mechsink.experiments import get_experiment

    try:
        experiment = get_experiment(table["name"])
    except MechsinkError as exc:
        raise SettingError(str(exc), "name", "experiment", bare=True) from None
    known = experiment.settings()
    if "work_dir" in known:  # it writes runs of its own, under a folder a job does not give
        other = ("the atlas job (jobs = [\"atlas\"])" if experiment.name == "atlas" else
                 f"`mechsink experiment {experiment.name} --out DIR`")
        raise SettingError(
            f"experiment {experiment.name} writes its own runs into a work folder, which an "
            f"experiment job does not give it: run it with {other}; the experiment job runs "
            "the experiments that take a model, and sink_timeline.", "name", "experiment",
            bare=True)
    run_dir = table["settings"].get("run_dir")
    if isinstance(run_dir, str) and not Path(run_dir).is_absolute():
        table["settings"]["run_dir"] = str(base / run_dir)
    for key in table["settings"]:
        if key not in known or key in NOT_SETTINGS:
            raise SettingError(
                f"experiment {experiment.name} has no setting {key!r}: its settings are "
                f"{', '.join(k for k in known if k not in NOT_SETTINGS)}.", key,
                SETTINGS_TABLE, bare=True)


def takes_model(table: dict[str, Any]) -> bool:
    """Whether the experiment runs once per model (else once, on no model)."""
    from mechsink.experiments import get_experiment

    return get_experiment(str(table["name"])).needs_model


def check(spec: Spec, models: Sequence[str | None] = ()) -> None:
    """Every setting (:func:`mechsink.experiments.options.check_experiment_settings`),
    against each zoo name of ``models`` (None: without a model), before any model loads or
    organism trains; an error names the setting it is about, if given."""
    from mechsink.experiments.options import check_experiment_settings

    for model in models or [None]:
        try:
            check_experiment_settings(str(spec.name), spec.settings, model=model)
        except MechsinkError as exc:  # at the setting it names, if given
            named = re.search(r"--([a-z][a-z-]*)", str(exc))
            key = named.group(1).replace("-", "_") if named else None
            given = key if key in spec.settings else next(iter(spec.settings), None)
            raise SettingError(str(exc), given, SETTINGS_TABLE) from None


def run(model: Any, spec: Spec, *, model_name: str | None = None) -> dict[str, Any]:
    """The experiment's result data (``model`` None: an experiment that takes none)."""
    from mechsink.experiments import get_experiment

    experiment = get_experiment(str(spec.name))
    if model is None:
        return experiment.run(**spec.settings).data
    return experiment.run(model, model_name=model_name, **spec.settings).data


def run_shard(model: Callable[[], Any], shard: dict[str, Any]) -> dict[str, Any]:
    """A sweep shard: the experiment on the shard's model (``model()`` loads it), or once
    without one."""
    spec = from_settings(Spec, shard["settings"])
    if shard["model"] is None:
        return run(None, spec)
    return run(model(), spec, model_name=shard["model"]["label"])


def merge(table: dict[str, Any], done: list, missing: list[str], folder: Path) -> list[Path]:
    """Each model's result folder (keyed by the shard's digest: models whose labels slug alike
    never share one) and an index of them."""
    from mechsink.experiments import ExperimentResult
    from mechsink.io import atomic_write_text
    from mechsink.jobs.files import MERGED_SCHEMA, json_text

    name = table["name"]
    paths = []
    index = []
    for s, r in done:
        sub = s["id"].removeprefix("experiment--") if s["model"] else name
        ExperimentResult(name, r).save(folder / sub)
        index.append({"model": s["model"]["label"] if s["model"] else None, "folder": sub})
        paths.append(folder / sub)
    data = {"schema": MERGED_SCHEMA, "job": "experiment", "experiment": name,
            "settings": table["settings"], "missing": missing, "results": index}
    paths.append(atomic_write_text(folder / "experiments.json", json_text(data)))
    return paths
