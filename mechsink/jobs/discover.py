"""Edge-level circuit discovery as a job: ``mechsink discover`` and the sweep's ``discover``
table (one discovery per model, each written as ``mechsink discover --out`` writes it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechsink import settings
from mechsink.errors import MechsinkError
from mechsink.jobs.spec import (
    NUM,
    SettingError,
    at,
    cli_name,
    from_settings,
    parse_numbers,
    setting,
    sweep_name,
    sweep_table,
)

SELECTIONS = ("top", "greedy")


@dataclass(frozen=True)
class Spec:
    """Every option of a discovery (the command line's, with its defaults)."""

    metric: str | None = setting(None, (str,), "sink_score:L[:H], massive_value:L:POS:CH, "
                                 "resid_norm:L:POS, logit_diff[:GOOD:BAD], log_prob:T, kl",
                                 required=True)
    method: str = setting("eap-ig", (str,), "a method of mechsink.discover.methods: eap, "
                          "eap-ig, exact, ...")
    clean: Sequence[Any] | None = setting(None, (list,), "clean prompt (repeat for a batch; "
                                            "default: --n natural sequences of --seq-len "
                                            "tokens)")
    corrupted: Sequence[Any] | None = setting(None, (list,), "counterfactual prompts, one "
                                                "per --clean (default: corrupt by --ablation)")
    ablation: str = setting("position_mean", (str,), "zero, batch_mean, position_mean or "
                            "resample (without --corrupted)")
    positions: str | None = setting("0", (str,), "corrupt senders at these positions only "
                                    "(comma-separated; 'all' for every position)")
    n: int = setting(8, (int,), "natural prompts when --clean is not given")
    seq_len: int = setting(32, (int,), "tokens per natural prompt")
    max_exact: int = setting(1000, (int,), "when the re-patch disagrees with the method, patch "
                             "the circuit's edges exactly and select again, up to this many "
                             "exact edges")
    select: str = setting("top", (str,), "top (by score) or greedy")
    edges: int | None = setting(None, (int,), "circuit size (default: the smallest size "
                                "reaching --target)")
    target: float | int = setting(0.9, NUM, "faithfulness the circuit should reach")
    curves: str = setting("", (str,), "extra ablations for faithfulness curves, e.g. "
                          "zero,batch_mean")
    prepend_bos: bool = setting(True, (bool,), "put the tokenizer's BOS token at position 0 "
                                "of --clean / --corrupted prompts")
    discovery_seed: int = setting(0, (int,), "seed of the resample ablation and the "
                                  "random-circuit baselines")
    neurons: Sequence[Any] | None = setting(None, (list,), "MLP neurons as graph nodes of "
                                              "their own, e.g. L11:1229,1487 (repeat per "
                                              "layer), or super (the census's super-neuron "
                                              "sets)")
    export: str = setting("", (str,), "also write the circuit as edge lists other tools read: "
                          "tsv and/or json (comma-separated; edges.tsv, edges.json in --out: "
                          "auto-circuit and ACDC names, with scores)")
    memory_budget: str | None = setting(None, (str,), "bytes of activations to plan for, e.g. "
                                        "2GiB or 512MiB (default: a share of the device's free "
                                        "memory)", sweep=False)
    method_options: Mapping[str, Any] = dataclasses.field(
        default_factory=dict, metadata={"types": (dict,), "help": "the methods' own options "
                                        "(option -> value, as the registry declares them)",
                                        "sweep": False, "required": False})

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> Spec:
        """A spec from a sweep's flat settings: the methods' options (``steps = 10``) gathered
        into ``method_options``, other keys (a shard's) left out."""
        names = {f.name for f in dataclasses.fields(cls)} - {"method_options"}
        options = method_table()
        return cls(**{k: v for k, v in settings.items() if k in names},
                   method_options={k: v for k, v in settings.items() if k in options})


def method_table() -> dict[str, tuple[tuple[type, ...], Any]]:
    """The methods' command-line options as sweep settings: name -> (accepted types,
    declared default), read off the registry (:mod:`mechsink.discover.methods`)."""
    from mechsink.discover.methods import declared_options

    return {name: (NUM if o.type is float else (o.type,), o.default)
            for name, o in declared_options(command_line=True).items()}


class _Table(Mapping[str, tuple[tuple[type, ...], Any]]):
    """The sweep's ``[discover]`` table: the spec's settings and every method's options, read
    when used (a method registered later is in it)."""

    def _items(self) -> dict[str, tuple[tuple[type, ...], Any]]:
        return {**sweep_table(Spec), **method_table()}

    def __getitem__(self, key: str) -> tuple[tuple[type, ...], Any]:
        return self._items()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())


TABLE: Mapping[str, tuple[tuple[type, ...], Any]] = _Table()


def check_choices(spec: Spec) -> list[str]:
    """The method, ablations, prompt counts, the selection and the methods' options (a
    :class:`~mechsink.jobs.spec.SettingError` naming the option); returns the curves' extra
    ablations."""
    from mechsink.discover.methods import METHODS
    from mechsink.interventions.ablation import KINDS

    if spec.method not in METHODS:
        raise SettingError(f"--method must be one of {', '.join(METHODS)}, got "
                           f"{spec.method!r}.", "method")
    extra = [a for a in spec.curves.split(",") if a.strip()]
    for a in ([] if spec.corrupted else [spec.ablation]) + extra:
        if a not in KINDS:
            raise SettingError(f"unknown ablation {a!r}: choose one of {', '.join(KINDS)}.",
                               "curves" if a in extra else "ablation")
    if spec.corrupted and len(spec.corrupted) != len(spec.clean or []):
        raise SettingError("give one --corrupted prompt per --clean prompt.", "corrupted")
    if spec.select not in SELECTIONS:
        raise SettingError(f"--select must be {', '.join(SELECTIONS[:-1])} or "
                           f"{SELECTIONS[-1]}, got {spec.select!r}.", "select")
    check_method_options(spec)
    return extra


def check_method_options(spec: Spec) -> None:
    """Each of ``spec.method_options`` as the registry declares it (type, choices, minimum):
    a :class:`~mechsink.jobs.spec.SettingError` naming the option."""
    from mechsink.discover.methods import check_options

    for key, value in spec.method_options.items():
        at(key, check_options, spec.method, {key: value}, cli_name)


def positions_of(spec: Spec) -> list[int] | None:
    """The sender positions corrupted (None: every position)."""
    if spec.positions in (None, "all"):
        return None
    return list(parse_numbers(spec.positions, "--positions", "position") or ())


def check_no_empty_prompt(clean: Sequence[str] | None, corrupted: Sequence[str] | None) -> None:
    """An empty --clean or --corrupted prompt is one line naming which."""
    for flag, texts in (("--clean", clean), ("--corrupted", corrupted)):
        empty = [i for i, t in enumerate(texts or [], 1) if not t.strip()]
        if empty:
            raise MechsinkError(f"{flag} prompt {empty[0]} is empty: give text (or leave "
                                "--clean out for --n natural prompts of --seq-len tokens).")


def export_formats(export: str) -> list[str]:
    """``--export tsv,json`` as the edge lists' suffixes."""
    formats = [f".{f.strip().lower()}" for f in export.split(",") if f.strip()]
    bad = [f[1:] for f in formats if f not in (".tsv", ".json")]
    if bad:
        raise MechsinkError(f"--export takes tsv and/or json (comma-separated), got "
                            f"{', '.join(map(repr, bad))}.")
    return list(dict.fromkeys(formats))


def check(spec: Spec, models: Sequence[str] = (),
          option: Callable[[str], str] = sweep_name) -> None:
    """Every option, and with the zoo names ``models`` the metric, ``seq_len`` and the
    prompts' lengths against each one's config and tokenizer, before any model loads."""
    from mechsink.discover.graph import parse_neurons
    from mechsink.discover.pipeline import check_selection
    from mechsink.jobs.prompts import check_same_lengths
    from mechsink.patching.metrics import check_without_corrupted

    at("method", check_choices, spec)
    at("positions", positions_of, spec)
    metric = at("metric", settings.read_metric, spec.metric)  # parsed once, here
    if spec.corrupted is None:  # an ablation corrupts: no corrupted prompt predicts a token
        at("metric", check_without_corrupted, metric)
    if spec.n < 1 or spec.max_exact < 0:
        at("n", _refuse, "--n must be positive, --max-exact non-negative.")
    at("clean", check_no_empty_prompt, spec.clean, spec.corrupted)
    at("edges", check_selection, spec.edges, spec.target)  # against the graph once built
    at("neurons", parse_neurons, None if spec.neurons is None else list(spec.neurons))
    at("export", export_formats, spec.export)
    if spec.memory_budget is not None:
        from mechsink.model.memory import parse_size

        at("memory_budget", parse_size, spec.memory_budget)
    for model in models:
        at("metric", settings.check_metric, metric, model)
        at("seq_len", settings.check_context, model, spec.seq_len, option("seq_len"))
        tok = settings.model_tokenizer(model) if spec.clean else None  # no weights needed
        if tok is not None:
            at("clean", check_same_lengths, tok,
               {"--clean": spec.clean, "--corrupted": spec.corrupted}, early=True)


def _refuse(message: str) -> None:
    raise MechsinkError(message)


def run(model: Any, spec: Spec, *, model_name: str, check_lengths: bool = False) -> Any:
    """The discovery on ``model`` (a :class:`mechsink.discover.Discovery`); ``check_lengths``:
    the prompts' lengths with the model's own tokenizer (one that came with the weights)."""
    from mechsink.discover import discover
    from mechsink.discover.graph import parse_neurons
    from mechsink.inputs.prompts import make_prompts
    from mechsink.jobs.prompts import check_same_lengths
    from mechsink.model import check_supported, to_tokens
    from mechsink.model.memory import parse_size
    from mechsink.model.tokens import tokenizer_of
    from mechsink.patching import parse_metric

    check_supported(model, "discover")
    clean = None if spec.clean is None else list(spec.clean)
    corrupted = None if spec.corrupted is None else list(spec.corrupted)
    if clean and check_lengths:
        check_same_lengths(tokenizer_of(model), {"--clean": clean, "--corrupted": corrupted})
    if clean:
        tokens = to_tokens(model, clean, prepend_bos=spec.prepend_bos)
    else:
        tokens = make_prompts(model, "natural", "bos", n=spec.n, seq_len=spec.seq_len).tokens
    corr = to_tokens(model, corrupted, prepend_bos=spec.prepend_bos) if corrupted else None
    metric = parse_metric(str(spec.metric), model, tokens, corr)
    found = discover(model, tokens, metric, corrupted=corr,
                     ablation=None if corr is not None else spec.ablation,
                     positions=positions_of(spec), method=spec.method, select=spec.select,
                     n_edges=spec.edges, target=spec.target,
                     curve_ablations=check_choices(spec), seed=spec.discovery_seed,
                     neurons=parse_neurons(None if spec.neurons is None
                                           else list(spec.neurons)),
                     memory_budget=None if spec.memory_budget is None
                     else parse_size(spec.memory_budget),
                     max_exact=spec.max_exact, **spec.method_options)
    found.meta["model"] = model_name
    return found


def write(found: Any, folder: Path, spec: Spec) -> None:
    """discover.json, circuit.json, scores.safetensors, summary.md, the figures and the edge
    lists ``--export`` names, into ``folder``."""
    from mechsink.discover import save_edge_list
    from mechsink.viz.discover import draw_discovery

    found.save(folder)
    draw_discovery(folder)
    for suffix in export_formats(spec.export):
        save_edge_list(found.circuit, folder / f"edges{suffix}")


def to_data(found: Any) -> dict[str, Any]:
    """A discovery as JSON-able data with every edge's score (a shard's result)."""
    return found.to_dict(top=found.scores.graph.n_edges)


def from_data(data: dict[str, Any]) -> Any:
    """The discovery :func:`to_data` gave, without the model."""
    from mechsink.discover import Discovery
    from mechsink.discover.circuit import Circuit
    from mechsink.discover.curves import Curve
    from mechsink.discover.graph import Graph
    from mechsink.discover.scores import EdgeScores

    graph = Graph.from_dict(data["scores"]["graph"])
    scores = EdgeScores.from_dict(data["scores"], graph)
    circuit = Circuit.from_dict(data["circuit"], graph, scores=scores.values)
    curves = [Curve.from_dict(c) for c in data.get("curves", [])]
    meta = {k: v for k, v in data.items()
            if k not in ("schema", "scores", "circuit", "curves", "non_finite")}
    return Discovery(scores, circuit, curves, meta)


def run_shard(model: Callable[[], Any], shard: dict[str, Any]) -> dict[str, Any]:
    """A sweep shard: the discovery on the shard's model (``model()`` loads it), with every
    edge's score."""
    found = run(model(), from_settings(Spec, shard["settings"]),
                model_name=shard["model"]["label"], check_lengths=True)
    return to_data(found)


def merge(table: dict[str, Any], done: list, missing: list[str], folder: Path) -> list[Path]:
    """Each model's discovery in a folder of its own (keyed by the shard's digest), as
    ``mechsink discover --out`` writes it, and an index of them with each one's circuit size
    and faithfulness."""
    from mechsink.io import atomic_write_text
    from mechsink.jobs.files import MERGED_SCHEMA, json_text

    spec = from_settings(Spec, table)
    paths: list[Path] = []
    index = []
    for s, r in done:
        sub = s["id"].removeprefix("discover--")
        found = from_data(r)
        write(found, folder / sub, spec)
        index.append({"model": s["model"]["label"], "folder": sub,
                      "edges": len(found.circuit.edges),
                      "faithfulness": found.circuit.faithfulness})
        paths.append(folder / sub)
    data = {"schema": MERGED_SCHEMA, "job": "discover", "settings": table, "missing": missing,
            "results": index}
    paths.append(atomic_write_text(folder / "discoveries.json", json_text(data)))
    return paths
