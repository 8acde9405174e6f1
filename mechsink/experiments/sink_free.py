"""Which attention variant removes the sink, which removes the massive activation, and at what cost
in loss? Twin organisms side by side.

For each task recipe (a llama recipe: Bigram-Backcopy, text) and each seed, plain softmax
attention and every variant of :data:`mechsink.model.variants.ATTENTION_VARIANTS` are trained with
the same seed (initialisation of the shared weights), the same batches and the same steps. Each
organism's checkpoints are measured on one held-out batch (data seed never seen in training):
final training loss (mean of the last 5% of steps), sink rate at key 0 (queries i > 0, eps as
given), the largest sink score, the largest residual magnitude, and the largest first-token norm
ratio; and what the variant buys at deployment, on the final checkpoint and the same batch:
streaming perplexity under a window of ``W = seq_len // 4`` recent tokens with ``s = 0`` and
``s = 1`` first tokens kept and their ratio (Xiao et al. 2024, "Efficient Streaming Language
Models with Attention Sinks"), and the loss change under weight-only int4 round-to-nearest
(Yu et al. 2024, "The Super Weight in Large Language Models"). The table gives mean, standard
deviation and range over seeds. The variants are: softmax1
(Miller 2023, "Attention Is Off By One"), a learnable sink logit (OpenAI 2025, gpt-oss model card),
gated attention (Qiu et al. 2025), softpick (Zuhri et al. 2025), sigmoid attention without
normalisation (Gu et al. 2024, "When Attention Sink Emerges in Language Models") and a learnable
key/value bias (Sun et al. 2024, "Massive Activations in Large Language Models").

Sink score of a variant with no normalisation over keys (sigmoid attention): the share of the
head's output mass on key 0, ``A[i,0] / sum_j A[i,j]``; for the others, the weight on key 0 as
it multiplies the value (it may sum to less than one over the keys: the rest went to the null
slot).

Deployment cells. Streaming (:func:`mechsink.interventions.streaming.perplexity_table`, its
recompute formulation: every window a fresh sequence ``[first s tokens] + [last W tokens]`` at
positions ``0 .. s + W - 1``, no KV cache) is run on each held-out sequence; every sequence
scores the same targets ``W + 1 .. seq_len - 1``, so the perplexity over the batch is the
geometric mean of the sequences'. Quantization
(:func:`mechsink.interventions.weight_quantization.quantized_weights`) rounds every linear
weight of the decoder (a gated arm's gate included; not the embeddings, the LM head, norms,
biases nor a variant's sink logit or key/value slot) to int4, asymmetric min-max per group of
``GROUP_SIZE`` input channels (one group per row where the input is narrower). Before either,
the model measured is checked against the organism's own transformers forward (the one it was
trained with) on the paths each measurement takes; a cell that cannot be measured says why
(``{"not_applicable": reason}``) instead of a number.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.experiments.options import check_experiment_settings
from mechsink.experiments.result import ExperimentResult
from mechsink.interventions.streaming import (
    check_streaming_args,
    last_logits,
    perplexity_table,
    window_tokens,
)
from mechsink.interventions.weight_quantization import (
    BITS,
    GROUP_SIZE,
    quantized_weights,
    sequence_losses,
)
from mechsink.io import atomic_write_json
from mechsink.measure.sinks import DEFAULT_EPS
from mechsink.measure.timeline import sink_timeline
from mechsink.model import context_length, hf_model_of, load_model
from mechsink.model.variants import ATTENTION_VARIANTS, attention_variant_of
from mechsink.model.zoo import load_organism_hf
from mechsink.training.loop import get_recipe, train

FIGURE = "sink_free.png"
SCHEMA = "mechsink-sink-free/2"
HELD_OUT_SEED = 10_000  # data seed of the measurement batch: never seen in training
HELD_OUT_SEQUENCES = 32
PLAIN = "softmax"
TIMELINE_METRICS = {  # key in a timeline point -> column title
    "final_loss": "final loss",
    "sink_rate_no_self": "sink rate",
    "max_sink_score": "largest sink score",
    "max_abs_resid": "largest |residual|",
    "first_token_norm_ratio": "first-token norm ratio",
}
DEPLOY_METRICS = {  # key in an arm's final dict -> column title
    "stream_ppl_s0": "streaming ppl, s=0",
    "stream_ppl_s1": "streaming ppl, s=1",
    "stream_ratio": "ppl s=0 / s=1",
    "int4_delta_loss": "int4 Δloss",
}
METRICS = {**TIMELINE_METRICS, **DEPLOY_METRICS}
STREAM_SINKS = (0, 1)  # first tokens kept: none, and the first (BOS in every task)
REFERENCE_RTOL = 1e-4  # largest logit gap to the organism's own forward, over its largest logit


def arm_name(recipe: str, variant: str) -> str:
    """The recipe name of one arm (``bb-llama-tiny`` or ``bb-llama-tiny+softpick``)."""
    return recipe if variant == PLAIN else f"{recipe}+{variant}"


def final_loss(losses: list[float]) -> float:
    """Mean training loss over the last 5% of steps."""
    tail = max(1, len(losses) // 20)
    return statistics.fmean(losses[-tail:])


def stream_window(seq_len: int) -> int:
    """The streaming window of a recipe: a quarter of its training length (at least one token),
    short enough that most of the context a sequence saw in training is gone."""
    return max(1, seq_len // 4)


def not_applicable(reason: str) -> dict[str, str]:
    """A cell that cannot be measured, with why."""
    return {"not_applicable": reason}


def forward_gap(model: Any, reference: Any, tokens: Int[Tensor, "batch pos"], *,
                last_only: bool) -> str | None:
    """Why ``model`` (what is measured) does not compute the organism's own transformers
    forward ``reference`` on ``tokens`` (None where it does): the logits of every position, or
    of the last only through the path streaming takes
    (:func:`~mechsink.interventions.streaming.last_logits`). An attention variant that the
    measured path bypassed would give softmax attention's numbers under the variant's name."""
    with torch.no_grad():
        if last_only:
            got: Float[Tensor, "batch vocab"] = last_logits(model, tokens).float()
            want = reference(tokens).logits[:, -1].float()
        else:
            got, want = model(tokens).float(), reference(tokens).logits.float()
    gap = float((got - want).abs().max())
    tol = REFERENCE_RTOL * max(1.0, float(want.abs().max()))
    if gap <= tol:
        return None
    variant = attention_variant_of(reference) or PLAIN
    return (f"the forward measured is not the organism's own: its logits differ from the "
            f"transformers model's (with the {variant} attention it was trained with) by up to "
            f"{gap:.3g} > {tol:.3g}, so the {variant} attention would not be what is measured.")


def streaming_cell(model: Any, reference: Any, tokens: Int[Tensor, "batch pos"]
                   ) -> dict[str, Any]:
    """Streaming perplexity of the held-out batch under a window of
    :func:`stream_window` tokens with each of :data:`STREAM_SINKS` first tokens kept, the
    dense perplexity of the same targets, and the ratio ``s=0 / s=1``
    (:func:`~mechsink.interventions.streaming.perplexity_table` per sequence)."""
    seq_len = int(tokens.shape[1])
    window = stream_window(seq_len)
    try:
        check_streaming_args((window,), STREAM_SINKS, seq_len, context_length(model))
    except BadInputError as exc:
        return not_applicable(f"sequences of {seq_len} tokens: {exc}")
    first = window + max(STREAM_SINKS)
    probe = window_tokens(tokens[0], list(range(first, seq_len))[:8], max(STREAM_SINKS), window)
    why = forward_gap(model, reference, probe, last_only=True)
    if why is not None:
        return not_applicable(why)
    log_dense, log_ppl = 0.0, dict.fromkeys(STREAM_SINKS, 0.0)
    for row in tokens:
        dense, table = perplexity_table(model, row, (window,), STREAM_SINKS)
        log_dense += math.log(dense)
        for s in STREAM_SINKS:
            log_ppl[s] += math.log(table[s][window])
    n = int(tokens.shape[0])  # every sequence scores the same number of targets
    ppl = {s: math.exp(v / n) for s, v in log_ppl.items()}
    bos = getattr(hf_model_of(model).config, "bos_token_id", None)
    return {"window": window, "sinks": list(STREAM_SINKS), "first_target": first,
            "scored": n * (seq_len - first),
            "first_token_is_bos": bos is not None and bool((tokens[:, 0] == bos).all()),
            "dense_perplexity": math.exp(log_dense / n),
            "perplexity": {str(s): v for s, v in ppl.items()},
            "ratio": ppl[0] / ppl[1]}


def full_precision_parameters(model: Any, quantized: dict[str, Any]) -> list[str]:
    """The kinds of parameter the quantizer leaves in full precision (layer indices as ``*``):
    everything that is not the weight of a linear module quantized."""
    weights = {id(m.weight) for m in quantized.values()}
    names = {re.sub(r"\.\d+\.", ".*.", n.replace("._original_component", ""))
             for n, p in hf_model_of(model).named_parameters() if id(p) not in weights}
    return sorted(names)


def quantization_cell(model: Any, reference: Any, tokens: Int[Tensor, "batch pos"]
                      ) -> dict[str, Any]:
    """The held-out loss in full precision and under weight-only int4 round-to-nearest per group
    of :data:`GROUP_SIZE` input channels (the quantizer's defaults), and the change."""
    why = forward_gap(model, reference, tokens[:4], last_only=False)
    if why is not None:
        return not_applicable(why)
    try:
        fp = sequence_losses(model, tokens)
        with quantized_weights(model, BITS, GROUP_SIZE) as mods:
            q = sequence_losses(model, tokens)
    except BadInputError as exc:
        return not_applicable(str(exc))
    return {"bits": BITS, "group_size": GROUP_SIZE, "n_linear": len(mods),
            "full_precision": full_precision_parameters(model, mods),
            "fp_loss": float(fp.mean()), "int4_loss": float(q.mean()),
            "delta_loss": float((q - fp).mean())}


def deployment(model: Any, reference: Any, tokens: Int[Tensor, "batch pos"]
               ) -> dict[str, dict[str, Any]]:
    """The streaming and quantization cells of one checkpoint (``model`` as measured,
    ``reference`` its transformers model as trained) on ``tokens``."""
    return {"streaming": streaming_cell(model, reference, tokens),
            "quantization": quantization_cell(model, reference, tokens)}


def deploy_finals(cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The :data:`DEPLOY_METRICS` of an arm's final dict: numbers, or the cell's reason."""
    st, q = cells["streaming"], cells["quantization"]
    if "not_applicable" in st:
        out: dict[str, Any] = {k: not_applicable(st["not_applicable"])
                               for k in ("stream_ppl_s0", "stream_ppl_s1", "stream_ratio")}
    else:
        out = {"stream_ppl_s0": st["perplexity"]["0"], "stream_ppl_s1": st["perplexity"]["1"],
               "stream_ratio": st["ratio"]}
    out["int4_delta_loss"] = (not_applicable(q["not_applicable"]) if "not_applicable" in q
                              else q["delta_loss"])
    return out


def measurement_key(steps: int, eps: float, seq_len: int) -> dict[str, Any]:
    """What a cached ``measured.json`` must match to be reused: the schema and every setting
    its numbers depend on."""
    return {"schema": SCHEMA, "steps": steps, "eps": eps, "held_out_seed": HELD_OUT_SEED,
            "stream_window": stream_window(seq_len), "stream_sinks": list(STREAM_SINKS),
            "quant_bits": BITS, "quant_group_size": GROUP_SIZE}


def run_arm(recipe: str, variant: str, seed: int, steps: int, work_dir: Path,
            eps: float = DEFAULT_EPS) -> dict:
    """Train (or resume, or reuse) one organism, measure its timeline and, on its final
    checkpoint, the deployment cells; cached in the run folder as ``measured.json`` (measured
    again when its key is not :func:`measurement_key`'s, e.g. an older schema)."""
    name = arm_name(recipe, variant)
    folder = work_dir / "runs" / f"{name}-seed{seed}"
    measured = folder / "measured.json"
    r = get_recipe(name)
    key = measurement_key(steps, eps, r.seq_len)
    if measured.is_file():
        cached = json.loads(measured.read_text())
        if cached.get("key") == key:
            return cached["arm"]
    run_file = folder / "run.json"
    if not run_file.is_file() or json.loads(run_file.read_text())["checkpoints"][-1] != steps:
        train(name, folder, steps=steps, seed=seed, resume=folder.exists(), progress=False)
    tokens = r.task().batch(HELD_OUT_SEED, 0, HELD_OUT_SEQUENCES, r.seq_len)
    run = json.loads(run_file.read_text())
    timeline = [vars(p) for p in sink_timeline(folder, tokens, eps=eps)]
    last = folder / f"step-{run['checkpoints'][-1]}"
    model = load_model(f"organism:{last}", device="cpu")
    reference, _ = load_organism_hf(last)
    cells = deployment(model, reference.eval(), tokens.to(model.cfg.device))
    arm = {"variant": variant, "seed": seed, "losses": run["losses"],
           "train_seconds": run["seconds"], "timeline": timeline, **cells,
           "final": {"final_loss": final_loss(run["losses"]),
                     **{k: timeline[-1][k] for k in TIMELINE_METRICS if k != "final_loss"},
                     **deploy_finals(cells)}}
    atomic_write_json(measured, {"key": key, "arm": arm})
    return arm


def spread(values: list[float]) -> dict[str, float]:
    """Mean, standard deviation (0 for one value), min and max over seeds."""
    return {"mean": statistics.fmean(values),
            "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values)}


def seed_cell(values: list[Any]) -> dict[str, Any]:
    """A table cell over seeds: :func:`spread`, or the first seed's reason where any seed's
    measurement did not apply (a spread over the others would hide it)."""
    reasons = [v["not_applicable"] for v in values if isinstance(v, dict)]
    return not_applicable(reasons[0]) if reasons else spread(values)


def run(*, work_dir: str | Path, recipes: Sequence[str] = ("bb-llama-tiny", "text-llama-tiny"),
        variants: Sequence[str] = ATTENTION_VARIANTS, seeds: Sequence[int] = (0, 1, 2),
        steps: Sequence[int] = (6000, 150), eps: float = DEFAULT_EPS) -> ExperimentResult:
    """Train plain attention and each variant for each seed under ``work_dir/runs`` (resumed
    when already there).

    ``recipes``: task recipes (llama recipes); ``variants``: attention variants beside plain
    softmax; ``seeds``: one twin set per seed; ``steps``: one length per recipe (or one for
    all); ``eps``: sink-rate threshold."""
    check_experiment_settings("sink_free", locals())  # before any work, as the CLI does
    steps = list(steps)
    if len(steps) == 1:
        steps = steps * len(recipes)
    if len(steps) != len(recipes):
        raise BadInputError(f"give one --steps value, or one per recipe ({len(recipes)}); "
                            f"got {len(steps)}.")
    for v in variants:
        if v not in ATTENTION_VARIANTS:
            raise BadInputError(f"unknown variant {v!r}: choose from "
                                f"{', '.join(ATTENTION_VARIANTS)}.")
    for recipe in recipes:
        get_recipe(recipe)  # a bad name fails before any training
    work = Path(work_dir)
    tasks = {}
    for recipe, n in zip(recipes, steps, strict=True):
        arms = {v: [run_arm(recipe, v, s, n, work, eps) for s in seeds]
                for v in (PLAIN, *variants)}
        table = {v: {m: seed_cell([a["final"][m] for a in runs]) for m in METRICS}
                 for v, runs in arms.items()}
        tasks[recipe] = {"steps": n, "data": get_recipe(recipe).data,
                         "stream_window": stream_window(get_recipe(recipe).seq_len),
                         "arms": arms, "table": table}
    return ExperimentResult("sink_free", {
        "schema": SCHEMA, "seeds": list(seeds), "eps": eps, "held_out_seed": HELD_OUT_SEED,
        "stream_sinks": list(STREAM_SINKS), "quant": {"bits": BITS, "group_size": GROUP_SIZE},
        "tasks": tasks})


def summary(result: dict[str, Any]) -> str:
    """The Markdown summary: one table per task, mean +- sd [min, max] over seeds; a cell that
    does not apply shows n/a and a numbered note with the reason."""
    lines = ["# Sink-free attention variants, twin organisms", "",
             f"Seeds {result['seeds']} (each seed: the same initialisation of the shared weights "
             "and the same batches in every arm). Measured at the last checkpoint on a held-out "
             f"batch (data seed {result['held_out_seed']}) of {HELD_OUT_SEQUENCES} sequences. "
             "Sink score: the "
             "attention on key 0 averaged over queries i > 0; sink rate: the share of (sequence, "
             f"layer, head) whose score is above {result['eps']}; largest sink score: the "
             "largest (layer, head) score averaged over sequences. For sigmoid attention (no "
             "normalisation over keys) the sink score is the head's share of output mass on "
             "key 0.", ""]
    if "quant" in result:  # schema 2 on
        q = result["quant"]
        lines += ["Streaming ppl: perplexity of the held-out sequences when each token is "
                  "predicted from the first s tokens (BOS for s=1) and the W tokens before it, "
                  "positions re-assigned (Xiao et al. 2024, \"Efficient Streaming Language "
                  "Models with Attention Sinks\"; W = seq_len // 4, given per task); "
                  "ppl s=0 / s=1: how much the arm relies on the kept first token. int4 Δloss: "
                  f"held-out loss under weight-only int{q['bits']} round-to-nearest (groups of "
                  f"{q['group_size']} input channels, one per row where the input is narrower) "
                  "minus the arm's own full-precision loss (Yu et al. 2024, \"The Super Weight "
                  "in Large Language Models\").", ""]
    notes: list[str] = []
    for recipe, task in result["tasks"].items():
        columns = list(next(iter(task["table"].values())))  # an older result: its own columns
        window = f", streaming window W = {task['stream_window']}" if "stream_window" in task \
            else ""
        lines += [f"## {recipe} ({task['data']}), {task['steps']} steps{window}", "",
                  "| arm | " + " | ".join(METRICS.get(m, m) for m in columns) + " |",
                  "|---" * (len(columns) + 1) + "|"]
        for variant, row in task["table"].items():
            cells = []
            for m in columns:
                c = row[m]
                if "not_applicable" in c:
                    if c["not_applicable"] not in notes:
                        notes.append(c["not_applicable"])
                    cells.append(f"n/a [{notes.index(c['not_applicable']) + 1}]")
                else:
                    f = ".4g" if m == "stream_ratio" else ".3g"  # a ratio near 1: 4 digits
                    cells.append(f"{c['mean']:{f}} ± {c['sd']:.2g} [{c['min']:{f}}, "
                                 f"{c['max']:{f}}]")
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        lines.append("")
    if notes:
        lines += ["Not applicable:", ""] + [f"{i}. {n}" for i, n in enumerate(notes, 1)] + [""]
    lines += [f"![variants]({FIGURE})", ""]
    return "\n".join(lines)


def figure(data: dict[str, Any], path: Path) -> Path:
    """One panel per table column (a result's own columns) and the sink timelines."""
    from mechsink.viz.experiments import plot_sink_free

    columns = next(iter(next(iter(data["tasks"].values()))["table"].values()))
    return plot_sink_free(data, path, {m: METRICS.get(m, m) for m in columns})
