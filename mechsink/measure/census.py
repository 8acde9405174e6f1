"""The sink census: every standard sink measurement of a model on every input suite.

:func:`census` runs each suite x first-token variant in chunks of ``batch_size`` sequences
(:func:`mechsink.measure.forward.measure_forward`: one forward per chunk, caching only the hooks
the measurements read) and takes every measurement of
:data:`mechsink.measure.registry.CENSUS_MEASUREMENTS` from each chunk's cache (pure functions,
:mod:`mechsink.measure`); the per-chunk results are merged exactly.
:func:`write_census` writes ``census.json`` atomically; its schema is documented in
``docs/census-schema.md`` (``schema: "mechsink-census/2"``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink import __version__
from mechsink.errors import BadInputError
from mechsink.inputs.prompts import (
    DEFAULT_N,
    DEFAULT_SEQ_LEN,
    SUITES,
    VARIANTS,
    PromptSet,
    check_suite_args,
    make_prompts,
)
from mechsink.io import atomic_write_text
from mechsink.measure import sinks
from mechsink.measure.cache import CacheLike, hook_names, rounded
from mechsink.measure.checks import check_batch_size
from mechsink.measure.forward import Forward, Measurement, first_chunk, measure_forward
from mechsink.measure.keys import scored_qk_hooks
from mechsink.measure.layer_stack import down_projection_layers, head_output_layers
from mechsink.measure.registry import (
    CENSUS_MEASUREMENTS,
    CensusContext,
    CensusMeasurement,
    NotApplicable,
)
from mechsink.model import (
    act_name,
    architecture_summary,
    bos_token_id,
    check_seq_len,
    down_projection,
    down_projection_bias,
    head_output_weights,
    moe_experts,
    post_mlp_norms,
    token_strings,
    true_dtype,
)
from mechsink.model.support import check_supported

SCHEMA = "mechsink-census/2"  # /2: super_neuron_sets (complete super-neuron sets)
READABLE_SCHEMAS = ("mechsink-census/1", SCHEMA)
CENSUS_FILE = "census.json"
DEFAULT_BATCH_SIZE = 8
EXAMPLE_HEADS = 4  # strongest sink heads whose pattern (sequence 0) is kept for the report

Progress = Callable[[str, int, int], None]  # (run name, sequences done, sequences in run)


@dataclass(frozen=True)
class AttentionExample:
    """The attention pattern of sequence 0 for the strongest sink heads of a run."""

    tokens: list[str]
    heads: list[tuple[int, int, float]]  # (layer, head, mean Gu sink score)
    patterns: Float[Tensor, "head query key"]

    def to_dict(self) -> dict[str, Any]:
        rows = []
        for (layer, head, score), pattern in zip(self.heads, self.patterns, strict=True):
            lower = [[rounded(v, 4) for v in pattern[i, : i + 1].tolist()]
                     for i in range(pattern.shape[0])]
            rows.append({"layer": layer, "head": head, "sink_score": rounded(score),
                         "pattern": lower})
        return {"sequence": 0, "tokens": self.tokens, "heads": rows}


@dataclass(frozen=True)
class RunCensus:
    """Every measurement of one suite x first-token variant: one attribute per entry of
    :data:`mechsink.measure.registry.CENSUS_MEASUREMENTS` (``run.sinks``, ``run.massive``,
    ``run.mlp``, ``run.super_sets``, ``run.norm_ratio``, ``run.value_drain``, ``run.heads``,
    ``run.keys``, ``run.variance``), and the attention example."""

    prompts: dict[str, Any]
    measurements: Mapping[str, Any]
    example: AttentionExample
    entries: tuple[CensusMeasurement, ...] = field(default=CENSUS_MEASUREMENTS, repr=False)
    #: the run's input tokens [sequence, position], kept so that a later step (the sets' causal
    #: check, :func:`mechsink.jobs.census.census`) runs on the same prompts; not in census.json
    tokens: Tensor | None = field(default=None, repr=False, compare=False)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("measurements", "entries", "tokens"):  # before init
            raise AttributeError(name)
        try:
            return self.measurements[name]
        except KeyError:
            raise AttributeError(f"RunCensus has no measurement {name!r}; it has "
                                 f"{', '.join(self.measurements)}.") from None

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *self.measurements})

    @property
    def name(self) -> str:
        return f"{self.prompts['suite']}/{self.prompts['variant']}"

    def __repr__(self) -> str:  # the dataclass default prints every tensor (~700 lines)
        top = self.example.heads[0] if self.example.heads else None
        head = "" if top is None else f", top_head=L{top[0]}H{top[1]} ({top[2]:.3f})"
        return (f"RunCensus({self.name!r}, n={self.prompts.get('n')}, "
                f"seq_len={self.prompts.get('seq_len')}, sink_rate={self.sinks.rate:.3f}"
                f"{head})")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, **self.prompts}
        for entry in self.entries:
            value = self.measurements[entry.name]
            if isinstance(value, NotApplicable):
                out.setdefault("not_applicable", {})[entry.name] = value.reason
            else:
                out.update(entry.to_json(value))
        out["attention_example"] = self.example.to_dict()
        return out


@dataclass(frozen=True)
class Census:
    """A model's census: what was run (settings) and one :class:`RunCensus` per input."""

    model: str
    architecture: dict[str, Any]
    settings: dict[str, Any]
    runs: tuple[RunCensus, ...] = field(default_factory=tuple)
    # which block's super-neuron set carries the sink: set by mechsink.jobs.census.census
    # (validate_sets=True), which runs mechsink.interventions.set_validation after the census
    super_neuron_causality: dict[str, Any] | None = None

    def run(self, suite: str, variant: str) -> RunCensus:
        for r in self.runs:
            if r.prompts["suite"] == suite and r.prompts["variant"] == variant:
                return r
        raise KeyError(f"no run {suite}/{variant} in this census")

    def to_frame(self) -> Any:
        """A pandas DataFrame, one row per run: sink rates, massive activations, super
        neurons, the first-token norm ratio range and the strongest sink head."""
        return census_frame({"runs": [r.to_dict() for r in self.runs]})

    def __repr__(self) -> str:  # the dataclass default prints every tensor (~700 lines)
        arch = self.architecture
        shape = f"{arch.get('n_layers', '?')} layers x {arch.get('n_heads', '?')} heads"
        names = ", ".join(r.name for r in self.runs)
        return (f"Census({self.model!r}, {shape}, {len(self.runs)} runs: {names}; "
                f"n={self.settings.get('n')}, seq_len={self.settings.get('seq_len')}, "
                f"eps={self.settings.get('eps')})")

    def _repr_html_(self) -> str:
        """Jupyter: the model, the settings and :meth:`to_frame` as a table."""
        from html import escape

        frame = self.to_frame()
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items()
                             if k in ("n", "seq_len", "seed", "eps", "dtype"))
        table = frame.to_html(index=False, float_format="{:.3g}".format)
        return (f"<div><b>Census</b> of <code>{escape(self.model)}</code> "
                f"({escape(settings)})<br>{table}</div>")

    def to_dict(self) -> dict[str, Any]:
        out = {"schema": SCHEMA, "mechsink_version": __version__, "model": self.model,
               "architecture": self.architecture, "settings": self.settings,
               "runs": [r.to_dict() for r in self.runs]}
        if self.super_neuron_causality is not None:
            out["super_neuron_causality"] = self.super_neuron_causality
        return out


# --- one cache -------------------------------------------------------------------------------


def needed_hooks(model: Any,
                 measurements: Sequence[CensusMeasurement] = CENSUS_MEASUREMENTS) -> list[str]:
    """Every hook name the measurements read (the census's names_filter)."""
    suffixes = {s for entry in measurements for s in entry.hooks_of(model)}
    return hook_names(int(model.cfg.n_layers), sorted(suffixes))


def measure_cache(
    cache: CacheLike,
    *,
    w_out: Float[Tensor, "layer d_mlp d_model"],
    w_o: Float[Tensor, "layer head d_head d_model"],
    eps: float = sinks.DEFAULT_EPS,
    position: int | None = None,
) -> dict[str, Any]:
    """All census measurements of one cache (pure: no model call), keyed by their registry
    name; sink scores of key ``position`` (default 0)."""
    context = CensusContext(w_out, w_o, eps, 0 if position is None else position)
    return {entry.name: entry.measure(cache, context) for entry in CENSUS_MEASUREMENTS}


# --- the census --------------------------------------------------------------------------------


def check_census_args(
    model: Any, suites: Sequence[str], variants: Sequence[str], n: int, seq_len: int,
    eps: float, batch_size: int,
) -> None:
    """Every argument check that can run before any work."""
    check_suite_args(suites, variants, n, seq_len)
    sinks.check_eps(eps)
    if batch_size is None:
        raise BadInputError("batch_size must be a positive integer, got None.")
    check_batch_size(batch_size)
    check_seq_len(model, seq_len)
    if "bos" in variants and bos_token_id(model) is None:
        raise BadInputError("variant 'bos' needs a BOS token and this tokenizer has none: "
                            "choose variants nobos/randfirst.")


def census(
    model: Any,
    suites: Sequence[str] = SUITES,
    variants: Sequence[str] = VARIANTS,
    *,
    n: int = DEFAULT_N,
    seq_len: int = DEFAULT_SEQ_LEN,
    eps: float = sinks.DEFAULT_EPS,
    seed: int = 0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    prompts: Sequence[PromptSet] | None = None,
    model_name: str | None = None,
    progress: Progress | None = None,
    measurements: Sequence[CensusMeasurement] = CENSUS_MEASUREMENTS,
) -> Census:
    """Measure ``model`` on every suite x variant (or on the given ``prompts`` instead).

    ``n`` sequences of ``seq_len`` tokens each, drawn from ``seed``; ``eps`` is the sink-rate
    threshold; ``batch_size`` sequences go through one forward (memory grows with it).
    ``measurements``: what each run measures (default: the registry; add an entry of your own
    with ``[*CENSUS_MEASUREMENTS, CensusMeasurement(...)]``).
    The causal check of the super-neuron sets (``super_neuron_causality``) is an intervention,
    not a measurement of the cache: :func:`mechsink.jobs.census.census` with
    ``validate_sets=True`` runs it after this census.
    """
    check_supported(model, "census")
    entries = _check_measurements(measurements)
    for what, names in (("suites", suites), ("variants", variants)):
        if isinstance(names, str):  # census(m, "natural") would read as suites n, a, t, ...
            raise BadInputError(f"{what} takes a list of names, not the string {names!r}: "
                                f"write [{names!r}].")
    if prompts is None:
        check_census_args(model, suites, variants, n, seq_len, eps, batch_size)
        prompt_sets = [make_prompts(model, s, v, n=n, seq_len=seq_len, seed=seed)
                       for s in suites for v in variants]
    else:
        prompt_sets = list(prompts)
        if not prompt_sets:
            raise BadInputError("prompts is empty: pass at least one PromptSet.")
        for p in prompt_sets:
            check_census_args(model, ["natural"], ["nobos"], p.n, p.seq_len, eps, batch_size)
    context = census_context(model, eps)
    with _default_bar(prompt_sets, progress) as report:
        runs = tuple(_run_one(model, p, context, batch_size, report, entries)
                     for p in prompt_sets)
    settings = {"suites": sorted({p.suite for p in prompt_sets}, key=_suite_order),
                "variants": sorted({p.variant for p in prompt_sets}, key=_variant_order),
                "n": n if prompts is None else None,
                "seq_len": seq_len if prompts is None else None,
                "seed": seed, "eps": eps, "key_position": 0, "batch_size": batch_size,
                "dtype": str(true_dtype(model)).replace("torch.", ""),
                "device": str(getattr(model.cfg, "device", "cpu") or "cpu")}
    return Census(model_name or str(getattr(model.cfg, "model_name", "model")),
                  architecture_summary(model), settings, runs)


def census_context(model: Any, eps: float = sinks.DEFAULT_EPS) -> CensusContext:
    """The weights the measurements read; a model without one MLP down projection per layer
    (mixture of experts) gets none, and the measurements that need it say so."""
    cfg = model.cfg
    try:  # the blocks' own tensors (no 1.4 GiB stacked copy on a 1.5B model), else stacked
        w_out, why = down_projection_layers(model), ""
        w_out = down_projection(model) if w_out is None else w_out
    except BadInputError as exc:
        w_out, why = None, str(exc).split(":")[0]
    if w_out is not None and (w_out.ndim != 3 or w_out.shape[0] != int(cfg.n_layers)
                              or w_out.shape[2] != int(cfg.d_model)):
        w_out, why = None, (f"this model's MLP down projections have shape "
                            f"{tuple(w_out.shape)}, not [layer, d_mlp, d_model]")
    if w_out is None:
        why += " (super neurons need one MLP down projection per layer; a mixture-of-experts " \
               "MLP has one per expert)"
    w_o = head_output_layers(model)  # the blocks' own tensors, else stacked
    return CensusContext(w_out, head_output_weights(model) if w_o is None else w_o, eps,
                         no_w_out=why,
                         post_norms=post_mlp_norms(model), b_out=down_projection_bias(model),
                         moe=moe_experts(model), qk_hooks=scored_qk_hooks(model))


@contextmanager
def _default_bar(prompt_sets: Sequence[PromptSet], progress: Progress | None
                 ) -> Iterator[Progress | None]:
    """The caller's progress callback, or (none given) one bar over every sequence of every
    run (:mod:`mechsink.progress`: on a terminal or in Jupyter, after two seconds)."""
    if progress is not None:
        yield progress
        return
    from mechsink.progress import bar

    done: dict[str, int] = {}
    with bar(sum(p.n for p in prompt_sets), "census", unit="seq") as b:

        def report(name: str, n_done: int, n_total: int) -> None:
            b.update(n_done - done.get(name, 0))
            done[name] = n_done
            b.set_postfix_str(name, refresh=False)

        yield report


def _suite_order(s: str) -> tuple[int, str]:
    return (SUITES.index(s) if s in SUITES else len(SUITES), s)


def _variant_order(v: str) -> tuple[int, str]:
    return (VARIANTS.index(v) if v in VARIANTS else len(VARIANTS), v)


def _example_pattern(n_layers: int) -> Measurement:
    """Sequence 0's attention pattern in every layer, ``[layer, head, query, key]`` (read from
    the first chunk only)."""

    def read(forward: Forward) -> Tensor | None:
        if forward.start > 0:
            return None
        return torch.stack([forward.cache[act_name("pattern", layer)][0]
                            for layer in range(n_layers)]).cpu()

    return Measurement(sinks.HOOKS, read, first_chunk)


def _check_measurements(measurements: Sequence[CensusMeasurement]
                        ) -> tuple[CensusMeasurement, ...]:
    """The census's measurements, checked before any work: entries with distinct names that
    do not hide a RunCensus attribute."""
    entries = tuple(measurements)
    if not entries or not all(isinstance(e, CensusMeasurement) for e in entries):
        raise BadInputError("measurements takes a non-empty list of CensusMeasurement entries "
                            "(mechsink.measure.registry).")
    names = [e.name for e in entries]
    if "sinks" not in names:
        raise BadInputError("measurements must keep the 'sinks' entry: the run's attention "
                            "example shows its strongest sink heads.")
    taken = {f.name for f in fields(RunCensus)} | {"name", "to_dict", "attention_example"}
    clash = sorted({n for n in names if names.count(n) > 1 or n in taken or n.startswith("_")})
    if clash:
        raise BadInputError(f"census measurement names must be distinct and must not be "
                            f"{', '.join(sorted(taken))} or start with '_': got {clash}.")
    return entries


def _run_one(
    model: Any, prompts: PromptSet, context: CensusContext, batch_size: int,
    progress: Progress | None, entries: tuple[CensusMeasurement, ...] = CENSUS_MEASUREMENTS,
) -> RunCensus:
    measurements = {entry.name: entry.on(model, context) for entry in entries}
    measurements["attention_example"] = _example_pattern(int(model.cfg.n_layers))

    def done(n_done: int, n_total: int) -> None:
        if progress is not None:
            progress(prompts.name, n_done, n_total)

    merged = measure_forward(model, prompts.tokens, measurements, batch_size=batch_size,
                             on_chunk=done)
    if isinstance(merged["sinks"], NotApplicable):
        raise BadInputError(f"the census cannot measure this model: {merged['sinks'].reason}.")
    example_pattern = merged.pop("attention_example")
    top = merged["sinks"].top_heads(EXAMPLE_HEADS)
    example = AttentionExample(
        token_strings(model, prompts.tokens[0]), top,
        torch.stack([example_pattern[layer, head] for layer, head, _ in top]).float(),
    )
    return RunCensus(prompts=prompts.to_dict(), measurements=merged, example=example,
                     entries=entries, tokens=prompts.tokens)


# --- output ------------------------------------------------------------------------------------


def check_out_dir(out_dir: str | Path) -> Path:
    """The output folder, checked before any work (a file there is an error); created."""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise BadInputError(f"--out {path} is a file, not a folder: give a folder path.")
    target = path / CENSUS_FILE
    if target.exists() and target.is_dir():
        raise BadInputError(f"{target} is a folder: remove it or choose another --out.")
    return path


def census_json(c: Census | Mapping[str, Any]) -> str:
    """The census as JSON text (stable key order, so equal censuses give equal text)."""
    from mechsink.io import json_text

    data = c.to_dict() if isinstance(c, Census) else dict(c)
    return json_text(data, indent=1, sort_keys=True)  # non-finite: null with a reason


def write_census(c: Census | Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write ``out_dir/census.json`` atomically (temporary file, then rename)."""
    folder = check_out_dir(out_dir)
    text = census_json(c)  # serialise fully before touching the disk
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / CENSUS_FILE
    atomic_write_text(target, text)
    return target


def read_census(path: str | Path) -> dict[str, Any]:
    """Read a census.json (a file or the folder holding it) and check its schema."""
    p = Path(path)
    if p.is_dir():
        p = p / CENSUS_FILE
    if not p.is_file():
        raise BadInputError(f"{p} does not exist: give a census.json or the folder holding one "
                            "(written by mechsink scan MODEL --out DIR).")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadInputError(f"{p} is not valid JSON ({exc}): it is not a census file, or it "
                            "is damaged; write it again with mechsink scan.") from exc
    if not isinstance(data, dict):
        raise BadInputError(f"{p} holds no census (a JSON {type(data).__name__}, not an object).")
    if data.get("schema") not in READABLE_SCHEMAS:
        raise BadInputError(f"{p} has schema {data.get('schema')!r}; this mechsink "
                            f"reads {', '.join(READABLE_SCHEMAS)}.")
    return data


# --- a short summary (terminal table and report) ----------------------------------------------


def summary_rows(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per run: sink rates, massive channels (both references), super neurons and the
    first-token norm ratio range."""
    rows = []
    for run in data["runs"]:
        row: dict[str, Any] = {"run": run["name"], "sink_rate": run["sink_rate"],
                               "sink_rate_no_self": run["sink_rate_no_self"]}
        for key, label in (("massive_activations", "massive"),
                           ("massive_activations_layer_median", "massive_layer_median")):
            acts = run.get(key, [])
            layers = [a["layer"] for a in acts]
            row[label] = {
                "count": len(acts),
                "at_position_0": sum(a["position"] == 0 for a in acts),
                "channels": sorted({a["channel"] for a in acts}),
                "layers": [min(layers), max(layers)] if layers else None,
                "max_abs": max((a["max_abs"] for a in acts), default=None),
            }
        row["super_neurons"] = [(s["layer"], s["neuron"], s["channel"])
                                for s in run.get("super_neurons", [])]
        ratio = [r for r in run.get("first_token_norm_ratio", []) if r is not None]
        row["norm_ratio_range"] = [min(ratio), max(ratio)] if ratio else None
        rows.append(row)
    return rows


def census_frame(data: Mapping[str, Any]) -> Any:
    """:func:`summary_rows` as a pandas DataFrame (one row per run, flat columns), from a
    :class:`Census`'s or a census.json's data."""
    import pandas as pd

    rows = []
    for row, run in zip(summary_rows(data), data["runs"], strict=True):
        heads = run.get("attention_example", {}).get("heads", [])
        ratio = row["norm_ratio_range"]
        rows.append({
            "run": row["run"], "n": run.get("n"), "seq_len": run.get("seq_len"),
            "sink_rate": row["sink_rate"], "sink_rate_no_self": row["sink_rate_no_self"],
            "top_sink_head": f"L{heads[0]['layer']}H{heads[0]['head']}" if heads else None,
            "top_sink_score": heads[0]["sink_score"] if heads else None,
            # both rules, as the CLI table shows them: against the token median (Sun et al.)
            # and against the layer's median (what flags SmolLM2's channels)
            "massive": row["massive"]["count"],
            "massive_channels": row["massive"]["channels"],
            "massive_layer_median": row["massive_layer_median"]["count"],
            "massive_layer_median_channels": row["massive_layer_median"]["channels"],
            "super_neurons": len(row["super_neurons"]),
            "norm_ratio_min": None if ratio is None else ratio[0],
            "norm_ratio_max": None if ratio is None else ratio[1],
        })
    return pd.DataFrame(rows)
