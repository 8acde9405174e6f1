"""The sink census as a job: ``mechsink scan`` and the sweep's ``census`` table.

:func:`census` is the census with its one intervention: ``validate_sets=True`` zeroes every
named super-neuron set (:mod:`mechsink.interventions.set_validation`) after the measurements of
:func:`mechsink.measure.census.census`, which reads caches only and so sits below the
interventions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mechsink import settings
from mechsink.errors import BadInputError
from mechsink.jobs.spec import NUM, at, from_settings, setting, sweep_name, sweep_table

if TYPE_CHECKING:
    from mechsink.measure.census import Census

#: mechsink.inputs.prompts.SUITES and VARIANTS, here so the command line imports no torch
SUITES = ("natural", "random", "repeated")
VARIANTS = ("bos", "nobos", "randfirst")


@dataclass(frozen=True)
class Spec:
    """The census's options (as ``mechsink scan`` takes them)."""

    suites: Sequence[Any] = setting(SUITES, (list,), "natural, random, repeated")
    variants: Sequence[Any] = setting(VARIANTS, (list,), "bos, nobos, randfirst")
    n: int = setting(32, (int,), "sequences per suite and variant")
    seq_len: int = setting(64, (int,), "tokens per sequence (T)")
    seed: int = setting(0, (int,), "seed of the inputs (and the weights of random:... models)")
    eps: float | int = setting(settings.DEFAULT_EPS, NUM,
                         "sink-rate threshold on the sink score, in (0, 1)")
    batch_size: int = setting(8, (int,), "sequences per forward pass")
    validate_sets: bool = setting(
        False, (bool,), "zero every super-neuron set against a same-size random set to name "
        "the block whose set carries the sink (1 + 2 x sets forwards of 16 prompts; off by "
        "default: it can take most of the census's time)", sweep=False)


#: a sweep measures many models: fewer sequences, and the BOS variant only
SWEEP_DEFAULTS = {"n": 8, "variants": ["bos"]}
TABLE = sweep_table(Spec, SWEEP_DEFAULTS)


def check(spec: Spec, models: Sequence[str] = (),
          option: Callable[[str], str] = sweep_name) -> None:
    """Every value, and each zoo name of ``models`` against its config, before any model
    loads; a :class:`~mechsink.jobs.spec.SettingError` naming the option."""
    from mechsink.inputs.corpus import check_corpus_size

    at("suites", settings.check_suites, spec.suites, spec.variants, 1, 2)
    at("n", settings.check_n, spec.n, option("n"))
    at("seq_len", settings.check_suites, spec.suites, spec.variants, 1, spec.seq_len)
    at("eps", settings.check_eps, spec.eps, option("eps"))
    at("batch_size", settings.check_batch_size, spec.batch_size, option("batch_size"))
    for model in models:
        at("seq_len", settings.check_context, model, spec.seq_len, option("seq_len"))
        if "natural" in spec.suites and settings.reads_the_corpus(model):
            at("n", check_corpus_size, spec.n, option("n"))


def census(model: Any, suites: Sequence[str] = SUITES, variants: Sequence[str] = VARIANTS, *,
           validate_sets: bool = False,
           progress: Callable[[str, int, int], None] | None = None, **options: Any) -> Census:
    """:func:`mechsink.measure.census.census` of ``model`` (``options``: its keywords), and with
    ``validate_sets`` the causal check of its super-neuron sets (``super_neuron_causality``).

    The check zeroes every named set of one run (natural text first) and a same-size random set
    of its block, and says which block's set carries the sink (1 + 2 x sets forwards of up to
    16 of that run's prompts). Off by default: it is an intervention, not a measurement of the
    cache, and it cost most of a census (220 s of 235 s on Qwen2.5-0.5B, n = 8, natural text,
    two first-token variants); the structural-origin experiment and the atlas run it where a
    verdict rests on it.
    """
    from mechsink.measure.census import census as measure_census

    found = measure_census(model, suites, variants, progress=progress, **options)
    if not validate_sets:
        return found
    if progress is not None:  # a step of its own after the runs: named while it runs
        progress("validating super-neuron sets", 0, 1)
    from mechsink.progress import phase

    with phase("census: validating super-neuron sets"):  # timed in a log
        return replace(found, super_neuron_causality=set_causality(model, found))


def set_causality(model: Any, found: Census) -> dict[str, Any]:
    """census.json's ``super_neuron_causality`` for the census ``found`` of ``model`` (its
    runs' own prompts, seed, eps and batch size); a float16 model whose edited values overflow
    gets ``{"not_applicable": why}`` instead of an error."""
    from mechsink.interventions.set_validation import census_validation

    if any(r.tokens is None for r in found.runs):
        raise BadInputError("the sets' causal check needs the census's prompts: run it on a "
                            "census just measured, not one read back from census.json.")
    settings = found.settings
    try:
        return census_validation(model, found.runs, [r.tokens for r in found.runs],
                                 eps=settings["eps"], seed=settings["seed"],
                                 batch_size=settings["batch_size"])
    except BadInputError as exc:  # float16 overflow under the edits: stated, not a crash
        if "float16, whose largest value" not in str(exc):  # precision.overflow_advice
            raise
        return {"not_applicable": f"the sets' causal check needs values beyond float16's "
                                  f"range: {exc}"}


def run(model: Any, spec: Spec, *, model_name: str,
        progress: Callable[[str, int, int], None] | None = None) -> dict[str, Any]:
    """The census of ``model`` as JSON-able data (census.json's content)."""
    return census(model, list(spec.suites), list(spec.variants), n=spec.n,
                  seq_len=spec.seq_len, eps=spec.eps, seed=spec.seed,
                  batch_size=spec.batch_size, model_name=model_name, progress=progress,
                  validate_sets=spec.validate_sets).to_dict()


def write(data: dict[str, Any], folder: Path, *, report: bool = True) -> list[Path]:
    """census.json (strict JSON, sorted keys) and, with ``report``, the figures and pages."""
    from mechsink.io import atomic_write_json
    from mechsink.measure.census import CENSUS_FILE

    written = [atomic_write_json(folder / CENSUS_FILE, data, sort_keys=True)]
    if report:
        from mechsink.viz import write_report

        written += write_report(data, folder)
    return written


COLUMNS = ("model", "run", "sink_rate", "sink_rate_no_self", "massive",
           "massive_at_position_0", "massive_channels", "super_neurons", "n_layers", "n_heads")


def run_shard(model: Callable[[], Any], shard: dict[str, Any]) -> dict[str, Any]:
    """A sweep shard: the census of the shard's model (``model()`` loads it)."""
    return run(model(), from_settings(Spec, shard["settings"]),
               model_name=shard["model"]["label"])


def merge(table: dict[str, Any], done: list, missing: list[str], folder: Path) -> list[Path]:
    """The sweep's census: every model's census, one row per model and run (JSON and CSV),
    and the sink-rate figure."""
    from mechsink.io import atomic_write_text
    from mechsink.jobs.files import MERGED_SCHEMA, csv_text, json_text
    from mechsink.measure.census import summary_rows

    models = [{"model": s["model"]["label"], "census": r} for s, r in done]
    rows = []
    for entry in models:
        arch = entry["census"]["architecture"]
        for row in summary_rows(entry["census"]):
            rows.append({"model": entry["model"], "run": row["run"],
                         "sink_rate": row["sink_rate"],
                         "sink_rate_no_self": row["sink_rate_no_self"],
                         "massive": row["massive"]["count"],
                         "massive_at_position_0": row["massive"]["at_position_0"],
                         "massive_channels": " ".join(map(str, row["massive"]["channels"])),
                         "super_neurons": len(row["super_neurons"]),
                         "n_layers": arch.get("n_layers"), "n_heads": arch.get("n_heads")})
    data = {"schema": MERGED_SCHEMA, "job": "census", "settings": table,
            "missing": missing, "table": rows, "models": models}
    paths = [atomic_write_text(folder / "census.json", json_text(data)),
             atomic_write_text(folder / "census.csv", csv_text(rows, list(COLUMNS)))]
    if rows:
        from mechsink.viz.sweep import sink_rate_figure

        paths.append(sink_rate_figure(rows, folder / "sink_rate.png"))
    return paths
