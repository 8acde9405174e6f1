"""The query-bias circuit through the dose-response machinery: each part of the circuit scaled
from full removal (0) to three times its size, with 95% intervals over prompts (no verdict below
8 prompts: :data:`mechsink.interventions.stats.MIN_N_APART`).

The parts (a 2026 study of GPT-2-style models names them: the query bias, the layer-0 MLP at
position 0, structure in W_K): ``b_Q`` of the sink heads' layers (every query changes); only
``b_Q . k_0`` in the logits to key 0 (the targeted removal: every other logit untouched, so "the
bias makes key 0 win" is told apart from "the bias changes every query"); the layer-0 MLP's
output at position 0; W_K's structure (keys interpolated toward a random rotation). Read out:
the mean sink score at key 0 of the sink heads in the sink heads' layers (Gu et al. 2024, "When
Attention Sink Emerges in Language Models"), the sink rate and the loss, per dose.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechsink.errors import BadInputError
from mechsink.experiments.gpt2_query_bias import head_scores, inputs
from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult, verdict_lines
from mechsink.interventions.bias_targets import (
    key_structure_set,
    mlp0_at_first_token,
    query_bias_key0_set,
    query_bias_set,
)
from mechsink.interventions.dose import DEFAULT_DOSES, dose_response
from mechsink.interventions.first_token import traced_prompts
from mechsink.interventions.stats import (
    LEVEL,
    MIN_N_APART,
    TOO_FEW,
    Interval,
    interval_text,
)
from mechsink.interventions.targets import Target
from mechsink.model import query_bias
from mechsink.training.loop import task_of

FIGURE = "dose_response.png"
SCHEMA = "mechsink-c6-dose/1"
NECESSARY = 0.5  # removing a part is "necessary" when < half the clean sink score is left


def _verdict(clean: dict[str, float], removed: dict[str, float]) -> tuple[str, str, str]:
    """Necessary / dispensable / undecided from the interval at full removal against half
    the clean value (the moved sink compared with the original, not with zero)."""
    bound = NECESSARY * clean["mean"]
    criterion = (f"at full removal (dose 0) the sink heads' mean score at key 0 is below "
                 f"{NECESSARY:.0%} of its clean value (the whole {LEVEL:.0%} interval over "
                 "prompts below: necessary; the whole interval above: dispensable; "
                 f"not called with fewer than {MIN_N_APART} prompts; "
                 "otherwise undecided)")
    evidence = f"clean {interval_text(clean)}, removed {interval_text(removed)}, " \
               f"threshold {bound:.3f}"
    if not Interval.from_dict(removed).callable:
        return TOO_FEW, criterion, evidence
    if removed["high"] < bound:
        return "necessary", criterion, evidence
    if removed["low"] > bound:
        return "dispensable", criterion, evidence
    return "undecided", criterion, evidence


def run(model: Any, *, model_name: str | None = None, n: int = 16, seq_len: int = 32,
        top: int = 4, doses: Sequence[float] = DEFAULT_DOSES, rotation_seed: int = 0,
        batch_size: int = 8) -> ExperimentResult:
    """Dose each part of the query-bias circuit in the layers of the ``top`` strongest sink
    heads, on ``n`` sequences of ``seq_len`` tokens (the organism's task for a task organism,
    natural text otherwise: with BOS unless the model has no sink behind BOS,
    :func:`~mechsink.interventions.first_token.traced_prompts`).

    ``n``: sequences; ``seq_len``: tokens per sequence; ``top``: sink heads whose layers are
    dosed; ``doses``: factors (must hold 0 and 1); ``rotation_seed``: the W_K rotation's and the
    bootstrap's seed;
    ``batch_size``: sequences per forward.
    """
    check_experiment_settings("query_bias_dose", locals())  # before any work, as the CLI does
    if n < 2:
        raise BadInputError(f"n must be at least 2 (intervals over prompts), got {n}.")
    if top < 1:
        raise BadInputError(f"top must be at least 1, got {top}.")
    model_name = model_name or model.cfg.model_name
    variant = None  # a task organism reads its own task
    if task_of(model_name) is not None:
        tokens = inputs(model, model_name, n, seq_len)
    else:  # natural text with BOS, unless the model has no sink behind BOS
        variant, _, prompts = traced_prompts(model, n, seq_len)
        tokens = prompts[variant]
    base = head_scores(model, tokens)
    order = base.flatten().argsort(descending=True)[:top].tolist()
    heads = [(i // base.shape[1], i % base.shape[1]) for i in order]
    layers = sorted({lay for lay, _ in heads if query_bias(model, lay) is not None})
    data: dict[str, Any] = {
        "schema": SCHEMA, "model": model_name, "n": n, "seq_len": seq_len, "seed": rotation_seed,
        "inputs": "task" if variant is None else "natural text, BOS" if variant == "bos"
        else f"natural text, first token {variant} (no sink behind BOS)",
        "traced_variant": variant,
        "sink_heads": [{"layer": lay, "head": h, "sink_score": float(base[lay, h])}
                       for lay, h in heads],
        "layers": layers, "curves": {}, "verdicts": {}}
    if not layers:
        data["not_applicable"] = "the sink heads' layers have no query bias (b_Q)"
        return ExperimentResult("query_bias_dose", data)
    targets: dict[str, Target] = {
        "query bias (every query)": query_bias_set(model, layers),
        "b_Q . k_0 only (logits to key 0)": query_bias_key0_set(model, layers, seq_len),
        "W_K structure": key_structure_set(model, layers, seed=rotation_seed),
    }
    if layers != [0]:
        targets["layer-0 MLP at position 0"] = mlp0_at_first_token(model)
    for name, target in targets.items():
        curve = dose_response(model, tokens, target, doses, late_layers=layers, seed=rotation_seed,
                              batch_size=batch_size)
        d = curve.to_dict()
        data["curves"][name] = d
        clean, removed = d["rows"][d["doses"].index(1.0)], d["rows"][d["doses"].index(0.0)]
        if clean["late_sink_score"] is None:
            data["verdicts"][name] = {"verdict": "not applicable", "criterion": "-",
                                      "evidence": "no sink head in the dosed layers"}
            continue
        verdict, criterion, evidence = _verdict(clean["late_sink_score"],
                                                removed["late_sink_score"])
        data["verdicts"][name] = {"verdict": verdict, "criterion": criterion,
                                  "evidence": evidence}
    return ExperimentResult("query_bias_dose", data)


def _cell(x: dict[str, Any] | None) -> str:
    """An interval as text; one that has zero width carries its reason."""
    if x is None:
        return "-"
    text = interval_text(x)
    return text + (f" ({x['note']})" if x.get("note") else "")


def summary(data: dict[str, Any]) -> str:
    """The Markdown summary: per part, the dose-response table with intervals, and verdicts."""
    lines = [f"# Query-bias circuit, dose-response, on {data['model']}", "",
             f"Inputs: {data['n']} sequences of {data['seq_len']} tokens ({data['inputs']}). "
             f"Dosed layers (of the strongest sink heads): {data['layers']}. Intervals: "
             f"{LEVEL:.0%} over prompts (Student's t below 64 prompts, percentile bootstrap "
             "from 64).", ""]
    if "not_applicable" in data:
        return "\n".join([*lines, f"Not applicable: {data['not_applicable']}.", ""])
    for name, curve in data["curves"].items():
        read = [f"L{lay}H{h}" for lay, h in curve["frame"]["sink_heads"]
                if lay in data["layers"]]
        lines += [f"## {name}", "", f"Target: {curve['target']}. Sink heads read (clean score "
                  f"over eps {curve['frame']['eps']:g} in the dosed layers): "
                  f"{', '.join(read) or 'none'}.", "",
                  "| dose | sink heads' score at key 0 | sink rate | loss |", "|---|---|---|---|"]
        for r in curve["rows"]:
            lines.append(f"| {r['dose']:g} | {_cell(r['late_sink_score'])} | "
                         f"{_cell(r['sink_rate'])} | {_cell(r['loss'])} |")
        lines.append("")
    lines += [*verdict_lines(data["verdicts"]), "", f"![dose-response]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path | None:
    """One panel per part: the sink heads' score at key 0 against the dose, with its band
    (drawn by :func:`mechsink.viz.experiments.plot_query_bias_dose`, at page width)."""
    from mechsink.viz.experiments import plot_query_bias_dose

    return plot_query_bias_dose(data, path, LEVEL)
