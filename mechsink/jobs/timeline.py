"""One training checkpoint's sink measurements as a job: the sweep's ``timeline`` table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechsink import settings
from mechsink.jobs.spec import NUM, at, from_settings, setting, sweep_name, sweep_table


@dataclass(frozen=True)
class Spec:
    """The prompts and threshold each checkpoint is measured with."""

    suite: str = setting("natural", (str,), "natural, random or repeated")
    variant: str = setting("nobos", (str,), "bos, nobos or randfirst")
    n: int = setting(8, (int,), "sequences")
    seq_len: int = setting(64, (int,), "tokens per sequence")
    seed: int = setting(0, (int,), "seed of the prompts")
    eps: float | int = setting(settings.DEFAULT_EPS, NUM, "sink-rate threshold, in (0, 1)")


TABLE = sweep_table(Spec)
COLUMNS = ["model", "step", "loss", "sink_rate", "sink_rate_no_self", "max_sink_score",
           "first_token_norm_ratio", "max_abs_resid"]


def check(spec: Spec, models: Sequence[str] = (),
          option: Callable[[str], str] = sweep_name) -> None:
    """Every value, and each model's context, before any model loads."""
    from mechsink.inputs.corpus import check_corpus_size

    at("suite", settings.check_suites, [spec.suite], [spec.variant], 1, 2)
    at("n", settings.check_n, spec.n, option("n"))
    at("seq_len", settings.check_suites, [spec.suite], [spec.variant], 1, spec.seq_len)
    at("eps", settings.check_eps, spec.eps, option("eps"))
    for model in models:
        at("seq_len", settings.check_context, model, spec.seq_len, option("seq_len"))
        if spec.suite == "natural" and settings.reads_the_corpus(model):
            at("n", check_corpus_size, spec.n, option("n"))


def run(model: Any, spec: Spec) -> dict[str, Any]:
    """The checkpoint's measurements (one point of the timeline)."""
    from mechsink.inputs.prompts import make_prompts
    from mechsink.measure.timeline import measure_checkpoint

    tokens = make_prompts(model, spec.suite, spec.variant, n=spec.n, seq_len=spec.seq_len,
                          seed=spec.seed).tokens
    return measure_checkpoint(model, tokens, spec.eps)


def run_shard(model: Callable[[], Any], shard: dict[str, Any]) -> dict[str, Any]:
    """A sweep shard: one checkpoint's point (``model()`` loads it)."""
    return run(model(), from_settings(Spec, shard["settings"]))


def merge(table: dict[str, Any], done: list, missing: list[str], folder: Path) -> list[Path]:
    """Every checkpoint's point, with its step and loss (JSON and CSV)."""
    from mechsink.io import atomic_write_text
    from mechsink.jobs.files import MERGED_SCHEMA, csv_text, json_text

    rows = [{"model": s["model"]["label"], "step": s["model"]["meta"].get("step"),
             "loss": s["model"]["meta"].get("loss"), **r} for s, r in done]
    data = {"schema": MERGED_SCHEMA, "job": "timeline", "settings": table,
            "missing": missing, "points": rows}
    return [atomic_write_text(folder / "timeline.json", json_text(data)),
            atomic_write_text(folder / "timeline.csv", csv_text(rows, COLUMNS))]
