"""One validation for every setting: the CLI, ``mechsink circuit``, the sweep's spec check and
the experiments' ``run()`` call these, so a bad value gets the same one-line message everywhere,
before any model loads.

The vocabularies are not repeated here: suites and variants come from
:mod:`mechsink.inputs.prompts`, sites and metrics from :mod:`mechsink.patching` (their own
parsers, which refuse unknown names), the sink threshold's range from
:func:`mechsink.measure.sinks.check_eps`. Each check is imported when it runs, so importing
this module (as the command line does) costs no torch import.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mechsink.errors import BadInputError

__all__ = [
    "DEFAULT_EPS",
    "DIRECTIONS",
    "check_batch_size",
    "check_context",
    "check_device",
    "check_direction",
    "check_eps",
    "check_experiment_settings",
    "check_layers",
    "check_metric",
    "check_n",
    "check_pair_lengths",
    "check_pairs",
    "check_positive",
    "check_seed",
    "check_site",
    "check_threads",
    "check_suites",
    "check_text",
    "model_config",
    "model_sizes",
    "model_tokenizer",
    "reads_the_corpus",
]

DEFAULT_EPS = 0.3  # mechsink.measure.sinks.DEFAULT_EPS, here so `mechsink --help` needs no torch
DIRECTIONS = ("denoise", "noise")

# experiment settings that count something: at least 1 (others that are numbers: at least 0)
_COUNTS = {"n", "seq_len", "top", "batch_size", "steps", "k", "layers", "n_random",
           "null_inits", "held_out_inits", "depths"}
# counts with a larger minimum: SeedPrint's calibration needs 3 null pairs and 2 test inits
_MINIMUM = {"null_inits": 3, "held_out_inits": 2}
SEED_MAX = 2**32 - 1  # numpy's seeds are 32-bit: torch's and ours stay within them too


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_positive(value: Any, option: str) -> None:
    """``value`` is an integer of at least 1, else a :class:`BadInputError` naming ``option``."""
    if not _is_int(value) or value < 1:
        raise BadInputError(f"{option} must be a positive integer, got {value!r}.")


def check_n(n: Any, option: str = "--n") -> None:
    """A number of sequences: at least 1."""
    check_positive(n, option)


def check_batch_size(batch_size: Any, option: str = "--batch-size") -> None:
    """Sequences per forward pass: at least 1."""
    check_positive(batch_size, option)


def check_seed(seed: Any, option: str = "--seed") -> None:
    """A seed is an integer in 0..2**32-1 (numpy's seeds are 32-bit; a negative or larger one
    would fail deep inside the work)."""
    if not _is_int(seed) or not 0 <= seed <= SEED_MAX:
        raise BadInputError(f"{option} must be an integer from 0 to {SEED_MAX} (2**32-1), got "
                            f"{seed!r}.")


def check_threads(threads: Any, option: str = "threads") -> None:
    """Torch threads per worker: at least 1 and at most this machine's cores."""
    import os

    cores = os.cpu_count() or 1
    if not _is_int(threads) or not 1 <= threads <= cores:
        raise BadInputError(f"{option} must be an integer from 1 to {cores} (this machine's "
                            f"cores), got {threads!r}.")


def check_eps(eps: Any, option: str = "--eps") -> None:
    """The sink threshold lies strictly between 0 and 1
    (:func:`mechsink.measure.sinks.check_eps`, its message after ``option``)."""
    from mechsink.measure.sinks import check_eps as in_range

    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise BadInputError(f"{option} must be a number strictly between 0 and 1, got {eps!r}.")
    try:
        in_range(float(eps))
    except BadInputError as exc:
        raise BadInputError(f"{option}: {exc}") from None


def check_suites(suites: Sequence[str], variants: Sequence[str], n: Any, seq_len: Any) -> None:
    """Known suites and first-token variants, ``n >= 1``, ``seq_len >= 2``
    (:func:`mechsink.inputs.prompts.check_suite_args`)."""
    from mechsink.inputs.prompts import check_suite_args

    check_suite_args(list(suites), list(variants), n, seq_len)


def check_device(device: str | None) -> None:
    """The device exists on this machine (``cuda`` on a CPU-only torch is an error)."""
    from mechsink.model.zoo import resolve_device

    resolve_device(device)


def model_config(model: str) -> Any | None:
    """The transformers config of zoo name ``model`` without its weights (None when that needs
    the model itself); an unknown name raises the error a load would."""
    from mechsink.model.zoo.load import config_of

    return config_of(model)


def model_sizes(model: str) -> Any | None:
    """Zoo name ``model``'s sizes from its config, as a stand-in for a loaded model (``.cfg``
    with ``n_layers``, ``n_heads``, ``d_model``, ``d_vocab``), so a layer, head or channel can
    be checked before the weights load; None when the config needs the model itself."""
    from types import SimpleNamespace

    config = model_config(model)
    if config is None:
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config

    def first(*names: str) -> int | None:
        found = [getattr(text, k, None) for k in names]
        return next((int(v) for v in found if isinstance(v, int) and v > 0), None)

    cfg = SimpleNamespace(n_layers=first("num_hidden_layers", "n_layer", "num_layers"),
                          n_heads=first("num_attention_heads", "n_head"),
                          d_model=first("hidden_size", "n_embd", "d_model"),
                          d_vocab=first("vocab_size"))
    if None in vars(cfg).values():
        return None
    return SimpleNamespace(cfg=cfg, name=model)


def model_tokenizer(model: str) -> Any | None:
    """Zoo name ``model``'s tokenizer, read without its weights (a ``random:`` model's GPT-2
    BPE, the tokenizer files of an organism, a local ``hf:`` folder or a converted model in the
    cache); None when only the load would give it (a hub id, a model not converted yet)."""
    from pathlib import Path

    from mechsink.model.zoo import NAMED_MODELS, organism_folder

    prefix, _, rest = model.partition(":")
    if prefix == "random" and rest:
        from mechsink.model.zoo.tokenizer import gpt2_tokenizer

        return gpt2_tokenizer()
    if model in NAMED_MODELS:
        from mechsink.model.zoo.cache import conversion_problem, converted_dir

        folder: Path | None = converted_dir(model)
        if conversion_problem(folder) is not None:
            return None
    elif prefix == "organism" and rest:
        folder = organism_folder(rest)
    elif prefix == "hf" and rest and Path(rest).is_dir():
        folder = Path(rest)
    else:
        return None
    from mechsink.model.zoo.folders import TOKENIZER_FILES

    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None  # the load says what is missing
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError):
        return None  # the load says what is wrong


def reads_the_corpus(model: str) -> bool:
    """Whether zoo name ``model``'s natural suite is the English corpus: every model but an
    organism trained on a synthetic task (its natural suite is drawn from the task, without
    limit)."""
    if not model.startswith(("organism:", "hf:")):
        return True
    from mechsink.inputs.tasks import task_of_tokenizer

    tok = model_tokenizer(model)
    return tok is None or task_of_tokenizer(tok) is None


def check_context(model: str, seq_len: int, option: str = "--seq-len") -> None:
    """``seq_len`` fits the model's context, read from its config (unknown names fail here
    too); a model whose config needs the weights is checked again once loaded."""
    config = model_config(model)
    if config is None:
        return
    n = getattr(config, "n_positions", None) or getattr(config, "max_position_embeddings", None)
    if n and seq_len > int(n):
        raise BadInputError(f"{option} {seq_len} is longer than the model's context ({model}: "
                            f"{int(n)} tokens): use a shorter sequence.")


def check_direction(direction: Any, option: str = "--direction") -> None:
    if direction not in DIRECTIONS:
        raise BadInputError(f"{option} must be {' or '.join(DIRECTIONS)}, got {direction!r}.")


def check_site(site: str, layers: Sequence[int] | None = None) -> None:
    """A site name :func:`mechsink.patching.parse_site` knows (its message on an unknown one)."""
    from mechsink.patching import parse_site

    parse_site(site, layers=None if layers is None else tuple(layers))


def check_metric(metric: str, model: str | None = None) -> None:
    """A metric string :func:`mechsink.patching.parse_metric` knows; bare ``logit_diff`` needs
    the model's predictions and is checked once it is loaded. With the zoo name ``model``, its
    layers, heads, channels and token ids against the model's config."""
    from mechsink.patching import parse_metric

    if metric.strip() != "logit_diff":
        parsed = parse_metric(metric, None)
        sizes = None if model is None else model_sizes(model)
        if sizes is not None:
            try:
                parsed.needs(sizes)
            except BadInputError as exc:
                text = str(exc)
                raise BadInputError(text.replace("this model", model) if "this model" in text
                                    else f"{text.rstrip('.')} ({model}).") from None


def check_layers(layers: Any, model: str | None = None, option: str = "layers") -> None:
    """Layer numbers: a list of integers from 0, and with the zoo name ``model`` below its
    layer count (read from its config)."""
    if layers is None:
        return
    if not isinstance(layers, (list, tuple)) or not layers or not all(_is_int(v) for v in layers):
        raise BadInputError(f"{option} must be a non-empty list of layer numbers (integers "
                            f"such as [0, 2, 5]), got {layers!r}.")
    if any(v < 0 for v in layers):
        raise BadInputError(f"{option}: layer numbers start at 0, got {list(layers)!r}.")
    sizes = None if model is None else model_sizes(model)
    if sizes is not None and max(layers) >= sizes.cfg.n_layers:
        n = sizes.cfg.n_layers
        raise BadInputError(f"{option}: layer {max(layers)} is out of range ({model} has {n} "
                            f"layers, numbered 0..{n - 1}).")


def check_pairs(pairs: Sequence[Any], where: str = "prompt pairs") -> None:
    """Prompt pairs: at least one, each two non-empty strings."""
    if not pairs:
        raise BadInputError(f"{where}: no prompt pairs: give at least one clean/corrupted pair.")
    for i, pair in enumerate(pairs, 1):
        if len(pair) != 2 or not all(isinstance(p, str) and p.strip() for p in pair):
            raise BadInputError(f"{where}: pair {i} must be two non-empty prompts, got {pair!r}.")
        for prompt in pair:
            check_text(prompt, f"{where}: pair {i}")


def check_pair_lengths(model: str, pairs: Sequence[Sequence[str]], where: str = "prompt pairs",
                       *, tokenizer: Any = None) -> bool:
    """Each pair's two prompts tokenise to the same number of tokens with zoo name ``model``'s
    tokenizer (patching compares them position by position); returns False when the tokenizer
    needs the model itself (check again once it is loaded, or pass ``tokenizer``)."""
    from mechsink.model.tokens import encode

    tok = tokenizer if tokenizer is not None else model_tokenizer(model)
    if tok is None:
        return False
    for i, pair in enumerate(pairs, 1):
        lengths = [len(encode(tok, text)) for text in pair]
        if len(set(lengths)) > 1:
            raise BadInputError(
                f"{where}: pair {i} tokenises to {lengths[0]} and {lengths[1]} tokens with "
                f"{model}'s tokenizer: give the two prompts of a pair the same number of tokens "
                "(patching compares them position by position).")
    return True


def check_text(text: str, option: str) -> None:
    """Text from the command line or a file is UTF-8: a byte that is not (Python keeps it as a
    lone surrogate, which a tokenizer cannot take) is one line naming ``option``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadInputError(f"{option} holds a byte that is not UTF-8 (character "
                            f"{exc.start + 1}): give the text as UTF-8.") from None


def _option(key: str) -> str:
    return "--" + key.replace("_", "-")


def check_experiment_settings(name: str, settings: Mapping[str, Any], *,
                              model: str | None = None) -> None:
    """The settings of experiment ``name`` (given ones over ``run()``'s defaults), before any
    model loads or organism trains: every required setting given; counts (``n``, ``seq_len``,
    ``top``, ...) at least 1, other numbers not negative, ``eps`` in (0, 1); with the zoo name
    ``model``, ``seq_len`` within its context, ``top`` within its heads and ``positions``
    inside the sequence."""
    from mechsink.experiments import get_experiment

    experiment = get_experiment(name)
    params = {k: p for k, p in experiment.settings().items() if k not in ("model_name",)}
    values: dict[str, Any] = {}
    for key, param in params.items():
        if key in settings:
            _check_type(name, key, param, settings[key])
            values[key] = settings[key]
        elif param.default is inspect.Parameter.empty:
            if key == "work_dir":
                continue  # given by --out
            raise BadInputError(f"{name} needs {_option(key)}: give it (e.g. {_option(key)} "
                                f"{'runs/NAME' if 'dir' in key else 'VALUE'}).")
        else:
            values[key] = param.default
    for key, value in values.items():
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                continue
            if isinstance(item, float) and not math.isfinite(item):
                raise BadInputError(f"{name} {_option(key)} must be a finite number, got {item}.")
            low = _MINIMUM.get(key, 1 if key in _COUNTS else 0)
            if item < low:
                what = f"at least {low}" if low else "0 or more"
                raise BadInputError(f"{name} {_option(key)} must be {what}, got {item}.")
    if "eps" in values:
        check_eps(values["eps"], f"{name} --eps")
    if "alpha" in values and not 0 < values["alpha"] < 0.5:
        raise BadInputError(f"{name} --alpha (a false-positive rate) must lie strictly between "
                            f"0 and 0.5, got {values['alpha']}.")
    if "run_dir" in values:
        _check_run_dir(name, values["run_dir"])
    if "seq_len" in values and values["seq_len"] < 2:
        raise BadInputError(f"{name} --seq-len must be at least 2 (a key at position 0 and a "
                            f"query after it), got {values['seq_len']}.")
    if "positions" in values and "seq_len" in values:
        outside = [p for p in values["positions"] if p >= values["seq_len"]]
        if outside:
            given = "given" if "positions" in settings else "default"
            raise BadInputError(
                f"{name} --positions ({given}: {' '.join(map(str, values['positions']))}) has "
                f"{', '.join(map(str, outside))} outside the sequence (--seq-len "
                f"{values['seq_len']}: positions 0..{values['seq_len'] - 1}): give --positions "
                "below --seq-len, or a longer --seq-len.")
    if model is None:
        return
    if "seq_len" in values:
        check_context(model, values["seq_len"], f"{name} --seq-len")
    if isinstance(values.get("layers"), int):  # p0_sink: candidate blocks 0..layers-1
        sizes = model_sizes(model)
        if sizes is not None and values["layers"] > sizes.cfg.n_layers:
            raise BadInputError(f"{name} --layers {values['layers']} is more than the model's "
                                f"{sizes.cfg.n_layers} layers ({model}): give --layers "
                                f"{sizes.cfg.n_layers} or fewer.")
    if "top" in values:
        config = model_config(model)
        layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
        heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
        if layers and heads and values["top"] > layers * heads:
            raise BadInputError(f"{name} --top {values['top']} is more than the model's "
                                f"{layers * heads} heads ({model}: {layers} layers x {heads}): "
                                "give a smaller --top.")


def _check_type(name: str, key: str, param: inspect.Parameter, value: Any) -> None:
    """``value`` has the type ``run()``'s annotation of setting ``key`` names: one number or
    text, or a list of them (``None`` where that is the default)."""
    import os

    from mechsink.experiments import setting_type

    kind, is_list = setting_type(param)
    if value is None and param.default is None:
        return

    def fits(item: Any) -> bool:
        if isinstance(item, bool):
            return False
        if kind is int:
            return isinstance(item, numbers.Integral)
        if kind is float:
            return isinstance(item, numbers.Real)
        return isinstance(item, (str, os.PathLike))

    shape = f"{kind.__name__} values" if is_list else f"one {kind.__name__}"
    if is_list:
        ok = (isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))
              and all(fits(v) for v in value))
    else:
        ok = fits(value)
    if not ok:
        example = "[8, 16]" if kind is int else "[0.5, 1.0]" if kind is float else '["a", "b"]'
        want = f"a list of {kind.__name__} values (e.g. {example})" if is_list else shape
        raise BadInputError(f"{name} --{key.replace('_', '-')} takes {want}, got {value!r}.")


def _check_run_dir(name: str, run_dir: Any) -> None:
    """A training run folder exists and holds ``run.json`` (what ``mechsink train`` writes)."""
    from pathlib import Path

    folder = Path(run_dir)
    if not folder.exists():
        raise BadInputError(f"{name} --run-dir {folder} does not exist: give the folder a "
                            "mechsink train run wrote.")
    if not folder.is_dir() or not (folder / "run.json").is_file():
        what = "is a file" if not folder.is_dir() else "holds no run.json"
        raise BadInputError(f"{name} --run-dir {folder} {what}: give the folder a mechsink "
                            "train run wrote (it holds run.json and step-N folders).")
