"""The command line of the ``circuits/`` scripts, read off each experiment's ``run()``.

Every keyword setting of ``run()`` is an option (``seq_len`` -> ``--seq-len``) with the type its
annotation names, a list where it takes a ``Sequence``, the signature's default and the help
text ``run()``'s docstring gives it (``\\`\\`name\\`\\`: text;``); so a script cannot drift from
the function it describes. The options are parsed by :meth:`Experiment.parse_settings`, the
parser of ``mechsink experiment NAME``: the same names, types and messages. ``--out`` is the
result folder (and the work folder of experiments that train their own organisms); experiments
that take a model add ``--model`` (default: the experiment's), ``--seed`` (weights of
``random:`` models) and ``--device`` (default: cpu). A bad option or setting is one line on
stderr and exit status 2, as for ``mechsink``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Sequence
from typing import Any

from mechsink.errors import BadInputError, MechsinkError
from mechsink.experiments import Experiment, Option, get_experiment
from mechsink.experiments.result import ExperimentResult

_EMPTY = inspect.Parameter.empty


def script_options(experiment: Experiment) -> list[Option]:
    """The options a ``circuits/`` script takes besides ``run()``'s settings: ``--out``, and
    ``--model``, ``--seed``, ``--device`` where the experiment takes a model."""
    own = [Option("out", str, False, _EMPTY, "folder for result.json, figures and summary.md")]
    if experiment.needs_model:
        own += [Option("model", str, False, experiment.default_model, "zoo name"),
                Option("seed", int, False, None, "weights seed (random: models)"),
                Option("device", str, False, "cpu", "cpu, cuda, ...")]
    return own


def parse_args(experiment: Experiment, argv: Sequence[str]) -> dict[str, Any]:
    """``argv`` as the script's options (``out``, and ``model``, ``seed``, ``device`` with their
    defaults where the experiment takes a model) and the settings given for ``run()``; a
    missing ``--out`` or a bad option is a :class:`~mechsink.errors.BadInputError`."""
    own = script_options(experiment)
    given = experiment.parse_settings(argv, extra=own)
    if "out" not in given:
        raise BadInputError(f"{experiment.name} needs --out DIR: the folder for its result.")
    return {**{o.name: o.default for o in own}, **given}


def main(name: str, description: str, argv: Sequence[str] | None = None) -> ExperimentResult:
    """Run experiment ``name`` with the options in ``argv`` (default: the command line), save
    its result under ``--out`` and print its summary; ``-h``/``--help`` lists the options."""
    experiment = get_experiment(name)
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        title = " ".join(description.strip().split("\n\n")[0].split())  # the first paragraph
        print(f"{title}\n\noptions:\n{experiment.options_help(script_options(experiment))}")
        raise SystemExit(0)
    try:
        return _run(experiment, parse_args(experiment, args))
    except MechsinkError as exc:  # one line, as the mechsink command prints it
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _run(experiment: Experiment, args: dict[str, Any]) -> ExperimentResult:
    """The experiment run on the parsed ``args``, its result saved under ``--out`` (held
    locked, as by ``mechsink experiment``: :meth:`Experiment.run_into`) and its summary
    printed; every setting is checked first (a model experiment's against the model's config,
    before its weights load)."""
    from mechsink.experiments.options import check_experiment_settings

    out = args.pop("out")
    model_name = args.pop("model", None)
    device, seed = args.pop("device", None), args.pop("seed", None)
    check_experiment_settings(experiment.name, args, model=model_name)
    result = experiment.run_into(out, args, model_name=model_name, device=device, seed=seed)
    print(result.summary())
    return result
