"""Gu et al.'s sink-rate protocol on one model: the table of "When Attention Sink Emerges".

Gu, Pang, Du et al. 2024 ("When Attention Sink Emerges in Language Models: An Empirical View")
report the sink rate at key position 0 (the share of heads whose mean attention to the first
token exceeds eps = 0.3, thresholded per sequence, queries ``i >= 0``) at T = 64 on natural
text, random tokens and one repeated token. This experiment measures the same on ``model``,
with and without the BOS token first (the paper's models start with theirs), with a 95%
interval over sequences on each rate, and quotes the paper's own rows beside it for context.

The rates come from the census's sink measurement (:mod:`mechsink.measure.sinks`) on every
suite, nothing else measured, so a large model runs the table in a few forwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mechsink.inputs.prompts import SUITES
from mechsink.interventions.stats import mean_interval
from mechsink.measure.census import census
from mechsink.measure.registry import CENSUS_MEASUREMENTS
from mechsink.measure.sinks import check_eps
from mechsink.model import bos_token_id, token_strings

SCHEMA = "mechsink-sink-protocol/1"
PAPER = ("Gu, Pang, Du et al. 2024, \"When Attention Sink Emerges in Language Models: An "
         "Empirical View\"")
#: the paper's sink rates (%) at k = 0, T = 64, eps = 0.3: natural / random / repeated input
PAPER_ROWS: dict[str, tuple[float, float, float]] = {
    "GPT2-XL": (77.0, 70.3, 62.3),
    "LLaMA2-7B": (92.5, 90.1, 0.0),
    "LLaMA3-8B": (99.0, 91.2, 0.0),
}


def run(model: Any, *, model_name: str | None = None, n: int = 32, seq_len: int = 64,
        eps: float = 0.3, batch_size: int = 8) -> Any:
    """The sink rate at key 0 on natural / random / repeated input, with and without BOS (the
    first only where the tokenizer has a BOS token); per rate the mean over sequences with its
    95% interval, in Gu's version (queries ``i >= 0``) and without query 0. Prompts are drawn
    from seed 0, as every experiment's.

    ``n``: sequences per suite and variant (the paper's protocol: at least 32); ``seq_len``:
    tokens per sequence (the paper's T = 64); ``eps``: the sink-rate threshold on a head's mean
    attention to key 0 (the paper's 0.3); ``batch_size``: sequences per forward.
    """
    from mechsink.experiments.result import ExperimentResult

    check_eps(eps)
    bos = bos_token_id(model)
    variants = ("bos", "nobos") if bos is not None else ("nobos",)
    entries = [m for m in CENSUS_MEASUREMENTS if m.name == "sinks"]
    found = census(model, SUITES, variants, n=n, seq_len=seq_len, eps=eps, seed=0,
                   batch_size=batch_size, measurements=entries, model_name=model_name)
    rows = []
    for r in found.runs:
        per = {}
        for own, include_self in (("gu", True), ("no_self", False)):
            rates = (r.sinks.per_sequence(include_self) > eps).double().mean(dim=(1, 2))
            per[own] = mean_interval(rates).to_dict()
        rows.append({"suite": r.prompts["suite"], "variant": r.prompts["variant"],
                     "sink_rate": per["gu"], "sink_rate_no_self": per["no_self"]})
    name = model_name or str(getattr(model.cfg, "model_name", "model"))
    data = {"schema": SCHEMA, "model": name,
            "settings": {"n": n, "seq_len": seq_len, "eps": eps, "seed": 0,
                         "key_position": 0, "batch_size": batch_size,
                         "dtype": found.settings["dtype"],
                         "bos_token": None if bos is None else token_strings(model, [bos])[0]},
            "rows": rows,
            "paper": {"source": PAPER, "columns": list(SUITES),
                      "rows": {m: list(v) for m, v in PAPER_ROWS.items()}}}
    return ExperimentResult("sink_protocol", data)


def rate(data: Mapping[str, Any], suite: str, variant: str, key: str = "sink_rate"
         ) -> Mapping[str, Any] | None:
    """One rate's interval dict (mean, low, high, ...) from a result's data, or None."""
    for row in data["rows"]:
        if row["suite"] == suite and row["variant"] == variant:
            return row[key]
    return None


def percent(iv: Mapping[str, Any] | None) -> str:
    """A rate as the paper prints it (percent, one decimal) with its interval."""
    if iv is None or iv.get("mean") is None:
        return "-"
    mean, low, high = (100 * float(iv[k]) for k in ("mean", "low", "high"))
    return f"{mean:.1f} [{low:.1f}, {high:.1f}]"


def table_lines(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The published layout: a row per model and first-token variant, a column per input
    suite, sink rates in percent with their 95% intervals; the paper's rows after them."""
    lines = ["| model | first token | " + " | ".join(SUITES) + " |",
             "|---|---|" + "---|" * len(SUITES)]
    for model, d in results.items():
        for variant in ("bos", "nobos"):
            if rate(d, SUITES[0], variant) is None:
                continue
            first = "BOS" if variant == "bos" else "no BOS"
            lines.append(f"| `{model}` | {first} | "
                         + " | ".join(percent(rate(d, s, variant)) for s in SUITES) + " |")
    for model, values in PAPER_ROWS.items():
        lines.append(f"| {model} (paper) | as published | "
                     + " | ".join(f"{v:.1f}" for v in values) + " |")
    return lines


def summary(data: Mapping[str, Any]) -> str:
    s = data["settings"]
    first = ("the tokenizer has no BOS token" if s.get("bos_token") is None
             else "BOS is `" + str(s["bos_token"]).replace("`", "'") + "`")
    lines = [f"# Sink-rate protocol: {data['model']}", "",
             f"Sink rate at key position 0 (Gu's version: queries i >= 0), eps = {s['eps']}, "
             f"n = {s['n']} sequences of T = {s['seq_len']} tokens per suite, seed {s['seed']}, "
             f"{s['dtype']}; {first}; in brackets the 95% interval over sequences. The paper's "
             f"rows ({data['paper']['source']}) are quoted for context: other models, the same "
             "protocol.", "", *table_lines({data["model"]: data}), "",
             "Without query 0 (queries i >= 1, which at key 0 never count the first token's "
             "attention to itself):", "",
             "| first token | " + " | ".join(SUITES) + " |", "|---|" + "---|" * len(SUITES)]
    for variant in ("bos", "nobos"):
        if rate(data, SUITES[0], variant) is None:
            continue
        lines.append(f"| {'BOS' if variant == 'bos' else 'no BOS'} | " + " | ".join(
            percent(rate(data, su, variant, "sink_rate_no_self")) for su in SUITES) + " |")
    return "\n".join(lines) + "\n"

