"""The command line of the ``circuits/`` scripts, read off each experiment's ``run()``.

Every keyword setting of ``run()`` is an option (``seq_len`` -> ``--seq-len``) with the type its
annotation names, a list where it takes a ``Sequence``, the signature's default and the help
text ``run()``'s docstring gives it (``\\`\\`name\\`\\`: text;``); so a script cannot drift from
the function it describes. ``--out`` is the result folder (and the work folder of experiments
that train their own organisms); experiments that take a model add ``--model`` (default: the
experiment's), ``--seed`` (weights of ``random:`` models) and ``--device`` (default: cpu).
"""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mechsink.experiments import Experiment, get_experiment, setting_type
from mechsink.experiments.result import ExperimentResult

_NOT_OPTIONS = ("model_name", "work_dir")  # given by --model and --out


def setting_help(run: Any, name: str) -> str:
    """The text ``run``'s docstring gives ``name`` (after ``\\`\\`name\\`\\`:``, up to the first
    ``;`` or sentence end outside parentheses), or "" when it gives none."""
    doc = " ".join((inspect.getdoc(run) or "").split())
    found = re.search(rf"``{re.escape(name)}``: ", doc)
    if found is None:
        return ""
    depth, text = 0, doc[found.end():]
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and (ch == ";" or (ch == "." and text[i + 1:i + 2] in ("", " "))):
            return text[:i]
    return text


def parser_for(experiment: Experiment, description: str) -> argparse.ArgumentParser:
    """An argument parser whose options are ``experiment.run``'s settings (see module doc)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True,
                        help="folder for result.json, figures and summary.md")
    if experiment.needs_model:
        parser.add_argument("--model", default=experiment.default_model,
                            help=f"zoo name (default: {experiment.default_model})")
        parser.add_argument("--seed", type=int, default=None, help="weights seed (random: models)")
        parser.add_argument("--device", default="cpu", help="cpu, cuda, ... (default: cpu)")
    for name, param in experiment.settings().items():
        if name in _NOT_OPTIONS:
            continue
        kind, is_list = setting_type(param)
        option: dict[str, Any] = {"type": kind, "help": setting_help(experiment.run, name)}
        if is_list:
            option["nargs"] = "+"
        if param.default is inspect.Parameter.empty:
            option["required"] = True
        else:
            option["default"] = list(param.default) if is_list else param.default
            if param.default is not None:
                shown = " ".join(map(str, option["default"])) if is_list else param.default
                option["help"] += f" (default: {shown})"
        parser.add_argument("--" + name.replace("_", "-"), dest=name, **option)
    return parser


def main(name: str, description: str, argv: Sequence[str] | None = None) -> ExperimentResult:
    """Run experiment ``name`` with the options in ``argv`` (default: the command line), save
    its result under ``--out`` and print its summary."""
    experiment = get_experiment(name)
    title = " ".join(description.strip().split("\n\n")[0].split())  # the first paragraph
    args = vars(parser_for(experiment, title).parse_args(argv))
    out = args.pop("out")
    if experiment.needs_model:
        from mechsink.experiments.options import check_experiment_settings
        from mechsink.model import load_model

        model_name = args.pop("model")
        settings = {k: v for k, v in args.items() if k not in ("device", "seed")}
        # every setting against the model's config before its weights load (run() checks
        # again, without the config)
        check_experiment_settings(name, settings, model=model_name)
        model = load_model(model_name, device=args.pop("device"), seed=args.pop("seed"))
        result = experiment.run(model, model_name=model_name, **args)
    else:
        if "work_dir" in experiment.settings():
            args["work_dir"] = out
        result = experiment.run(**args)
    result.save(out)
    print(result.summary())
    return result
