"""Each research question as a library function: ``run(...)`` returns an :class:`ExperimentResult`
whose ``summary()`` and ``figure()`` are drawn from its JSON-able data, never from a model.

The scripts in ``circuits/`` are methods sections over :func:`mechsink.experiments.script.main`,
which takes their options and defaults from ``run()``'s signature; ``mechsink experiment NAME``, the
docs build and the tests call the experiments directly. Scripts and command parse the options
with the one parser here (:meth:`Experiment.parse_settings`).

=====================  ================================================================
``structural_origin``  why position 0 becomes the sink: variance discrepancy, super
                       neurons, moving the sink (Li, Jiang, Sun et al. 2026, "The Structural
                       Origin of Attention Sink")
``sink_protocol``      Gu et al.'s sink-rate table (natural / random / repeated input, with
                       and without BOS, T = 64, eps = 0.3) with intervals, the paper's rows
                       quoted (Gu, Pang, Du et al. 2024, "When Attention Sink Emerges")
``p0_sink``            the P0-sink circuit by path patching (Peng, Li et al. 2026, "How
                       Attention Sinks Emerge in Large Language Models")
``p0_edges``           the P0-sink circuit as an edge graph (EAP-IG with the QK fix, exact
                       checks, faithfulness next to the greedy node circuit's)
``gpt2_query_bias``    the query-bias circuit of GPT-2-style models
``query_bias_dose``    the query-bias circuit dosed from removal to 3x, with intervals (and
                       the targeted removal of b_Q . k_0 alone)
``headwise_rmsnorm``   twin organisms with and without head-wise RMSNorm
``seedprint``          structure at random initialisation and SeedPrint (Li, Tong, Wang et
                       al. 2026)
``init_structure``     claim C7 as stated: token preference and contraction at init on
                       random twins of real architectures, SeedPrint, and the positional
                       discrepancy's causal link to the sink (organisms, W_O's init scaled)
``sink_timeline``      the sink measurements at every checkpoint of a training run
``atlas``              every claim on every model with the same prompts and settings: one
                       table of verdicts, criteria and evidence, linked to each run
=====================  ================================================================
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from mechsink.errors import BadInputError
from mechsink.experiments.result import ExperimentResult

__all__ = ["EXPERIMENTS", "Experiment", "ExperimentResult", "Option", "get_experiment"]


#: keywords of ``run()`` that are no option: the model argument, and the work folder (--out)
NOT_OPTIONS = ("model_name", "work_dir")


@dataclass(frozen=True)
class Option:
    """One command-line option of an experiment (a ``run()`` setting, or a script's own
    ``--out``/``--model``/...): its type, whether it takes a list, its default and help text."""

    name: str  # the keyword, e.g. seq_len (--seq-len)
    kind: type  # int, float or str: each value is converted with it
    is_list: bool
    default: Any  # inspect.Parameter.empty: required
    help: str

    @property
    def flag(self) -> str:
        """The option as typed on the command line (``seq_len`` -> ``--seq-len``)."""
        return "--" + self.name.replace("_", "-")

    def line(self) -> str:
        """The option as ``--help`` lists it: ``--seq-len INT  (default: 64)  text``."""
        if self.default is inspect.Parameter.empty:
            default = "required"
        elif self.is_list:
            default = "default: " + " ".join(map(str, self.default))
        else:
            default = f"default: {self.default}"
        shape = f"{self.kind.__name__.upper()}{' ...' if self.is_list else ''}"
        return f"  {self.flag} {shape}  ({default})" + (f"  {self.help}" if self.help else "")


@dataclass(frozen=True)
class Experiment:
    """One experiment of :mod:`mechsink.experiments`: its module and how it is called."""

    name: str
    default_model: str | None  # None: the experiment takes no model (it trains its own)

    @property
    def module(self) -> ModuleType:
        return importlib.import_module(f"mechsink.experiments.{self.name}")

    @property
    def run(self) -> Callable[..., ExperimentResult]:
        return self.module.run

    @property
    def needs_model(self) -> bool:
        return self.default_model is not None

    def settings(self) -> dict[str, inspect.Parameter]:
        """The keyword settings ``run`` takes (name -> parameter, with its default)."""
        params = inspect.signature(self.run).parameters
        return {n: p for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}

    def options(self) -> dict[str, Option]:
        """``run``'s settings as command-line options (all but :data:`NOT_OPTIONS`), typed by
        their annotations, with the help text ``run``'s docstring gives each."""
        out: dict[str, Option] = {}
        for key, param in self.settings().items():
            if key not in NOT_OPTIONS:
                kind, is_list = setting_type(param)
                out[key] = Option(key, kind, is_list, param.default, setting_help(self.run, key))
        return out

    def parse_settings(self, args: Sequence[str],
                       extra: Sequence[Option] = ()) -> dict[str, Any]:
        """Command-line options (``--seq-len 32 --positions 8 16``, or ``--seq-len=32``) as
        ``run``'s settings, typed by its signature, plus the ``extra`` options a caller adds
        (a script's ``--out``); only the options given. The one parser of ``mechsink experiment``
        and the ``circuits/`` scripts: an unknown option or a bad value is a
        :class:`BadInputError` that names the option."""
        known = {**self.options(), **{o.name: o for o in extra}}
        out: dict[str, list[str]] = {}
        key: str | None = None
        for arg in args:
            if arg.startswith("--"):
                flag, has_value, value = arg.partition("=")
                key = flag[2:].replace("-", "_")
                if key == "work_dir" and key in self.settings():
                    raise BadInputError(f"{self.name} has no option {flag}: it writes its "
                                        "runs under --out (one folder, locked while it runs): "
                                        "give --out DIR.")
                if key not in known:
                    options = ", ".join(o.flag for o in known.values())
                    raise BadInputError(f"{self.name} has no option {flag}: its options are "
                                        f"{options}.")
                out[key] = [value] if has_value else []
            elif key is None:
                raise BadInputError(f"unexpected argument {arg!r}: give settings as --name value.")
            else:
                out[key].append(arg)
        return {k: _typed(self.name, known[k], v) for k, v in out.items()}

    def options_help(self, extra: Sequence[Option] = ()) -> str:
        """The options ``extra`` and ``run``'s settings, one line each, as ``--help`` lists
        them (``mechsink experiment NAME --help`` and the ``circuits/`` scripts alike)."""
        own = [o.line() for o in extra] + [""] if extra else []
        settings = [o.line() for o in self.options().values()]
        return "\n".join([*own, "settings (from its run()):", *settings])

    def run_into(self, out: str | Path, settings: dict[str, Any], *,
                 model_name: str | None = None, device: str | None = None,
                 seed: int | None = None,
                 loading: Callable[[str], AbstractContextManager[Any]] | None = None
                 ) -> ExperimentResult:
        """Run with ``settings`` on ``model_name`` (loaded here; default: the experiment's) and
        save the result set into ``out``, holding the folder's lock from before the model loads
        until the result is written: the one body of ``mechsink experiment NAME`` and the
        ``circuits/`` scripts. The caller checks the settings first; a ``seq_len`` past a
        context only the weights tell is refused here, after the load and before the run.
        ``loading(name)`` wraps the load (a status line)."""
        from mechsink.io import check_writable, folder_lock

        folder = check_writable(out)  # before the work, not after it ('' is an error)
        settings = dict(settings)
        with folder_lock(folder):
            if self.needs_model:
                from mechsink.model import check_seq_len, load_model

                name = model_name or str(self.default_model)
                with (loading or (lambda _: nullcontext()))(name):
                    model = load_model(name, device=device, seed=seed)
                seq_len = settings.get("seq_len", self.settings().get("seq_len"))
                if seq_len is not None:  # a model whose config needed its weights
                    check_seq_len(model, getattr(seq_len, "default", seq_len))
                result = self.run(model, model_name=name, **settings)
            else:
                if "work_dir" in self.settings():
                    settings.setdefault("work_dir", folder)
                result = self.run(**settings)
            result.save(folder)  # one result set; the summary is drawn before any write
        return result


def setting_type(param: inspect.Parameter) -> tuple[type, bool]:
    """The value type a setting's annotation names (int, float, else str) and whether it takes
    a list (``Sequence[...]`` / ``list[...]``)."""
    note = str(param.annotation)
    is_list = note.startswith(("Sequence[", "list["))
    kind = {"int": int, "float": float}.get(re.sub(r"^(Sequence|list)\[|\].*$|\s*\|.*$", "",
                                                  note), str)
    return kind, is_list


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


def _typed(experiment: str, option: Option, values: list[str]) -> Any:
    """``values`` converted to ``option``'s type (one value or a list)."""
    kind, is_list = option.kind, option.is_list
    if not values or (len(values) > 1 and not is_list):
        raise BadInputError(f"{experiment} {option.flag} takes "
                            f"{'values' if is_list else 'one value'}, got {len(values)}.")
    try:
        typed = [kind(v) for v in values]
    except ValueError:
        raise BadInputError(f"{experiment} {option.flag} wants {kind.__name__} values, got "
                            f"{' '.join(values)}.") from None
    return typed if is_list else typed[0]


EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in (
    Experiment("structural_origin", "smollm2-135m"),
    Experiment("p0_sink", "smollm2-135m"),
    Experiment("sink_protocol", "smollm2-135m"),
    Experiment("p0_edges", "smollm2-135m"),
    Experiment("gpt2_query_bias", "organism:bb-gpt2-tiny"),
    Experiment("query_bias_dose", "organism:bb-gpt2-tiny"),
    Experiment("headwise_rmsnorm", None),
    Experiment("seedprint", None),
    Experiment("init_structure", None),
    Experiment("sink_timeline", None),
    Experiment("sink_free", None),
    Experiment("atlas", None),
)}


def get_experiment(name: str) -> Experiment:
    """The experiment called ``name``; an unknown name is a :class:`BadInputError`."""
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise BadInputError(f"unknown experiment {name!r}: choose one of "
                            f"{', '.join(EXPERIMENTS)}.") from None
