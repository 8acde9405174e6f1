"""The settings of an experiment checked before any work: ``run()``'s keywords, typed by its
signature, as ``mechsink experiment NAME``, the sweep's experiment job, the ``circuits/`` scripts
and each experiment's own ``run()`` give them (one message for a bad value everywhere)."""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from mechsink.errors import BadInputError
from mechsink.settings import check_context, check_eps, model_config, model_sizes

__all__ = ["check_experiment_settings"]

# experiment settings that count something: at least 1 (others that are numbers: at least 0)
_COUNTS = {"n", "seq_len", "top", "batch_size", "steps", "k", "layers", "n_random",
           "null_inits", "held_out_inits", "depths"}
# counts with a larger minimum: SeedPrint's calibration needs 3 null pairs and 2 test inits
_MINIMUM = {"null_inits": 3, "held_out_inits": 2}
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
