"""One validation for every setting: the jobs of :mod:`mechsink.jobs` (the CLI and the sweep)
and :mod:`mechsink.experiments.options` call these, so a bad value gets the same one-line
message everywhere, before any model loads.

The vocabularies are not repeated here: suites and variants come from
:mod:`mechsink.inputs.prompts`, sites and metrics from :mod:`mechsink.patching` (their own
parsers, which refuse unknown names), the sink threshold's range from
:func:`mechsink.measure.sinks.check_eps`. Each check is imported when it runs, so importing
this module (as the command line does) costs no torch import.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    "read_metric",
    "reads_the_corpus",
]

DEFAULT_EPS = 0.3  # mechsink.measure.sinks.DEFAULT_EPS, here so `mechsink --help` needs no torch
DIRECTIONS = ("denoise", "noise")

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


def read_metric(metric: str) -> Any:
    """The metric string parsed once, where it is received (:func:`mechsink.patching.
    parse_metric`, its form checked), to be checked against each model and handed to patching
    without parsing it again (a bare ``logit_diff`` takes its tokens from the patched runs)."""
    from mechsink.patching import parse_metric

    return parse_metric(metric, None)


def check_metric(metric: Any, model: str | None = None) -> None:
    """A metric string :func:`mechsink.patching.parse_metric` knows (or one
    :func:`read_metric` parsed). With the zoo name ``model``, its layers, heads, channels and
    token ids against the model's config."""
    parsed = read_metric(metric) if isinstance(metric, str) else metric
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
