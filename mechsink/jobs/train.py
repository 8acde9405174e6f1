"""Training an organism as a job: ``mechsink train``. Not a sweep job: a sweep runs models
that exist, and a training run is one resumable folder of its own (``--resume`` continues it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mechsink import settings
from mechsink.jobs.spec import SettingError, at, cli_name, setting


@dataclass(frozen=True)
class Spec:
    """A training run: the recipe, where it is written, how long and from which seed."""

    recipe: str | None = setting(None, (str,), "recipe name, e.g. bb-llama-tiny (add +hwrms)",
                                 sweep=False, required=True)
    out: str | None = setting(None, (str,), "run folder (new, or the run to resume)",
                              sweep=False, required=True)
    steps: int | None = setting(None, (int,), "number of steps (default: the recipe's; with "
                                "--resume, give the run's own)", sweep=False)
    seed: int = setting(0, (int,), "seed of the initialisation and of the batches", sweep=False)
    resume: bool = setting(False, (bool,), "continue the run held in --out", sweep=False)


def check(spec: Spec, option: Callable[[str], str] = cli_name) -> None:
    """The folder, the seed, the step count and the recipe's name, before the run folder is
    made or ``run.json`` written."""
    if spec.out is None or not str(spec.out).strip():
        raise SettingError(f"{option('out')} is empty: give the run folder.", "out")
    at("seed", settings.check_seed, spec.seed, option("seed"))
    if spec.steps is not None and spec.steps < 1:
        raise SettingError(f"{option('steps')} must be positive, got {spec.steps}.", "steps")
    from mechsink.training.loop import get_recipe

    at("recipe", get_recipe, spec.recipe)


def run(spec: Spec) -> Path:
    """Train (or resume) the run; returns its folder."""
    from mechsink.training import loop

    assert spec.recipe is not None and spec.out is not None  # check() said so
    return loop.train(spec.recipe, spec.out, steps=spec.steps, seed=spec.seed,
                      resume=spec.resume)
