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
from collections.abc import Mapping, Sequence
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
    "check_metric",
    "check_n",
    "check_pairs",
    "check_positive",
    "check_site",
    "check_suites",
    "check_text",
    "model_config",
]

DEFAULT_EPS = 0.3  # mechsink.measure.sinks.DEFAULT_EPS, here so `mechsink --help` needs no torch
DIRECTIONS = ("denoise", "noise")

# experiment settings that count something: at least 1 (others that are numbers: at least 0)
_COUNTS = {"n", "seq_len", "top", "batch_size", "steps", "k", "layers", "n_random",
           "null_inits", "held_out_inits", "depths"}


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


def check_metric(metric: str) -> None:
    """A metric string :func:`mechsink.patching.parse_metric` knows; bare ``logit_diff`` needs
    the model's predictions and is checked once it is loaded."""
    from mechsink.patching import parse_metric

    if metric.strip() != "logit_diff":
        parse_metric(metric, None)


def check_pairs(pairs: Sequence[Any], where: str = "prompt pairs") -> None:
    """Prompt pairs: at least one, each two non-empty strings."""
    if not pairs:
        raise BadInputError(f"{where}: no prompt pairs: give at least one clean/corrupted pair.")
    for i, pair in enumerate(pairs, 1):
        if len(pair) != 2 or not all(isinstance(p, str) and p.strip() for p in pair):
            raise BadInputError(f"{where}: pair {i} must be two non-empty prompts, got {pair!r}.")
        for prompt in pair:
            check_text(prompt, f"{where}: pair {i}")


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
            low = 1 if key in _COUNTS else 0
            if item < low:
                what = "at least 1" if low else "0 or more"
                raise BadInputError(f"{name} {_option(key)} must be {what}, got {item}.")
    if "eps" in values:
        check_eps(values["eps"], f"{name} --eps")
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
    if "top" in values:
        config = model_config(model)
        layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
        heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
        if layers and heads and values["top"] > layers * heads:
            raise BadInputError(f"{name} --top {values['top']} is more than the model's "
                                f"{layers * heads} heads ({model}: {layers} layers x {heads}): "
                                "give a smaller --top.")
