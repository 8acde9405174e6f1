"""Edge-scoring methods behind a registry, one file each (as auto-circuit's ``prune_algos/``).

A method is a function ``fn(run, **options) -> EdgeScores`` registered by name with
:func:`register`, which declares every option (keyword-only parameter) it takes as an
:class:`Option`: its type, default, help and allowed values. It may use the
:class:`~mechsink.discover.graph_run.GraphRun` interface its docstring lists and the shared
steps of :mod:`mechsink.discover.scores`. Every module of this package is imported when the
registry is first read (torch-free: the command line reads it at start-up, so a method imports
its heavy modules inside its function), so adding a method is adding one file:

.. code-block:: python

    from mechsink.discover.methods import VERIFY, Option, register

    @register("mine", options=(Option("rounds", int, 3, "how many rounds", minimum=1),
                               VERIFY))
    def mine(run, *, rounds: int = 3, verify: int = 20):
        from mechsink.discover.scores import result
        ...

:func:`~mechsink.discover.pipeline.discover`, ``mechsink discover`` and the sweep's
``[discover]`` table read the registry: a command-line option (``--rounds 5``, ``rounds = 5``)
and its check come from the declaration alone. Options several methods share (:data:`QK_FIX`,
:data:`VERIFY`, :data:`EDGES`) are declared here once; one name must mean the same in every
method that takes it.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mechsink.errors import BadInputError

#: the types a command-line option may have (an API-only option may say ``object``: the
#: method checks its value itself)
COMMAND_LINE_TYPES = (int, float, bool, str)


@dataclass(frozen=True)
class Option:
    """One option of a method: its ``name`` (the keyword; ``--name`` on the command line,
    ``name =`` in a sweep), ``type`` (int, float, bool or str; ``object`` for an API-only
    value), ``default`` (the function's own), ``help``, the values it allows (``choices``),
    the smallest integer it takes (``minimum``) and whether the command line and the sweep
    offer it (``command_line=False``: values such as edge lists, for the Python API only)."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    command_line: bool = True
    minimum: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "choices", tuple(self.choices))
        if self.command_line and self.type not in COMMAND_LINE_TYPES:
            raise ValueError(f"option {self.name!r}: a command-line option is an int, float, "
                             f"bool or str, not {self.type.__name__} (command_line=False for "
                             "an API-only one).")
        if self.default is not None and self.problem(self.default):
            raise ValueError(f"option {self.name!r}: its default {self.default!r} "
                             f"{self.problem(self.default)}.")

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` for this option (None: nothing), e.g. ``must be
        inputs or activations, got 'x'``, for the caller to prefix with the option's name."""
        if (value is None and self.default is None) or self.type is object:
            return None
        if not _is(value, self.type):
            return f"must be {_article(self.type)} {self.type.__name__}, got {value!r}"
        if self.choices and value not in self.choices:
            allowed = self.choices
            listed = allowed[0] if len(allowed) == 1 else (
                f"{', '.join(allowed[:-1])} or {allowed[-1]}")
            return f"must be {listed}, got {value!r}"
        if self.minimum is not None and value < self.minimum:
            return f"must be at least {self.minimum}, got {value!r}"
        return None


def _is(value: Any, kind: type) -> bool:
    """``value`` is of ``kind`` as an option reads it (a bool is no number; an int is a
    float)."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


def _article(kind: type) -> str:
    return "an" if kind.__name__[0] in "aeiou" else "a"


#: AtP*'s QK fix, shared by the first-order methods
QK_FIX = Option("qk_fix", bool, True, "AtP*'s QK fix for edges into queries and keys")
#: the exact re-check of the top edges, shared by the first-order methods
VERIFY = Option("verify", int, 20, "re-patch this many top edges exactly", minimum=0)
#: a subset of edges (indices into the graph's edges) a method works on alone
EDGES = Option("edges", object, None, "score these edges (indices into the graph's edges) "
               "alone; what happens to the others depends on the method", command_line=False)


@dataclass(frozen=True)
class Method:
    """A registered method: its ``name``, the function and the :class:`Option` s it declares
    (``declared``, in the function's parameter order)."""

    name: str
    fn: Callable[..., Any]
    declared: tuple[Option, ...] = ()

    @property
    def options(self) -> tuple[str, ...]:
        """The names of the options ``fn`` takes (what the pipeline and the CLI may pass)."""
        return tuple(o.name for o in self.declared)

    @property
    def choices(self) -> dict[str, tuple[str, ...]]:
        """The allowed values of each option that takes one of a few names."""
        return {o.name: o.choices for o in self.declared if o.choices}

    def option(self, name: str) -> Option | None:
        """The declaration of option ``name`` (None if the method does not take it)."""
        return next((o for o in self.declared if o.name == name), None)

    @property
    def summary(self) -> str:
        """The first line of the method's docstring."""
        return (inspect.getdoc(self.fn) or self.name).splitlines()[0]


_REGISTRY: dict[str, Method] = {}
_loaded = False


def register(name: str, *, options: Iterable[Option] = ()
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(run, **options) -> EdgeScores`` as method ``name`` (a decorator);
    ``options``: an :class:`Option` for every keyword-only parameter of ``fn``, with the same
    default (the command line, the sweep and the pipeline read them; a parameter left
    undeclared, or a declaration without its parameter, is refused)."""
    declared = tuple(options)

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"a discovery method {name!r} is already registered.")
        _REGISTRY[name] = Method(name, fn, _matched(name, fn, declared))
        return fn
    return add


def _matched(name: str, fn: Callable[..., Any], declared: tuple[Option, ...]
             ) -> tuple[Option, ...]:
    """``declared`` in the order of ``fn``'s keyword-only parameters, each checked against its
    parameter (a ValueError naming what differs)."""
    params = {p.name: p for p in inspect.signature(fn).parameters.values()
              if p.kind is inspect.Parameter.KEYWORD_ONLY}
    by_name = {o.name: o for o in declared}
    unknown = sorted(set(by_name) - set(params))
    if unknown:
        raise ValueError(f"method {name!r} declares {', '.join(unknown)}, which it does not "
                         "take (declare its keyword-only parameters).")
    missing = sorted(set(params) - set(by_name))
    if missing:
        raise ValueError(f"method {name!r} takes {', '.join(missing)} without declaring it: "
                         "give an Option for each keyword-only parameter.")
    for p in params.values():
        if p.default != by_name[p.name].default:
            raise ValueError(f"method {name!r}: option {p.name!r} is declared with default "
                             f"{by_name[p.name].default!r}, its parameter has {p.default!r}.")
    return tuple(by_name[p] for p in params)


def declared_options(command_line: bool = False) -> dict[str, Option]:
    """Every registered method's options by name, in registration order (``command_line``:
    those the command line and the sweep offer); one name declared by two methods must agree
    (a ValueError otherwise)."""
    out: dict[str, Option] = {}
    for method in METHODS.values():
        for option in method.declared:
            if command_line and not option.command_line:
                continue
            if out.setdefault(option.name, option) != option:
                raise ValueError(f"option {option.name!r} is declared as {out[option.name]} "
                                 f"by one method and as {option} by {method.name!r}: declare "
                                 "it once and share it.")
    return out


def option_choices() -> dict[str, tuple[str, ...]]:
    """Every registered method's declared choices, option -> allowed values."""
    return {name: o.choices for name, o in declared_options().items() if o.choices}


def _load() -> None:
    """Import every module of this package once (each registers its method), then check that
    the methods agree on the options they share."""
    global _loaded
    if not _loaded:
        _loaded = True
        for info in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{info.name}")
        declared_options()


class _Methods(Mapping[str, Method]):
    """The registry, read-only: name -> :class:`Method`, in registration order."""

    def __getitem__(self, name: str) -> Method:
        _load()
        return _REGISTRY[name]

    def __iter__(self) -> Any:
        _load()
        return iter(_REGISTRY)

    def __len__(self) -> int:
        _load()
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return f"METHODS({', '.join(self)})"


#: every registered method by name
METHODS: Mapping[str, Method] = _Methods()


def get(name: str) -> Method:
    """The method called ``name``; a clear error naming the registered ones otherwise."""
    if name not in METHODS:
        raise BadInputError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}.")
    return METHODS[name]


def check_options(method: str, options: Mapping[str, Any],
                  spell: Callable[[str], str] = str) -> dict[str, Any]:
    """Method ``method``'s options, checked against the declarations: every one it takes, the
    given value or the declared default. A name no registered method declares is refused
    (naming the options ``method`` takes), as is a value of the wrong type or outside its
    choices; an option another method declares is checked and left out, so one set of options
    (the command line's, a sweep's) serves every method. ``spell``: how a message writes an
    option's name (``--steps`` on the command line)."""
    m = get(method)
    for name, value in options.items():
        option = find_option(method, name)
        if option is None:
            raise BadInputError(f"method {method!r} takes "
                                f"{', '.join(map(spell, m.options)) or 'no options'}, not "
                                f"{spell(name)}.")
        problem = option.problem(value)
        if problem:
            raise BadInputError(f"{spell(name)} {problem}.")
    return {o.name: options.get(o.name, o.default) for o in m.declared}


def find_option(method: str, name: str) -> Option | None:
    """Method ``method``'s declaration of option ``name``, else the first other method's
    (None: no registered method declares it)."""
    own = get(method).option(name)
    return own or next((o for m in METHODS.values() for o in m.declared if o.name == name),
                       None)


def score_edges(run: Any, method: str, **options: Any) -> Any:
    """Score every edge of ``run`` with the method called ``method``; ``options`` it does not
    take are refused (use :func:`options_for` to pick a method's own from a larger set)."""
    m = get(method)
    unknown = sorted(set(options) - set(m.options))
    if unknown:
        raise BadInputError(f"method {method!r} takes {', '.join(m.options) or 'no options'}, "
                            f"not {', '.join(unknown)}.")
    return m.fn(run, **options)


def options_for(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``options`` that method ``method`` takes."""
    wanted = set(get(method).options)
    return {k: v for k, v in options.items() if k in wanted}


__all__ = ["COMMAND_LINE_TYPES", "EDGES", "METHODS", "QK_FIX", "VERIFY", "Method", "Option",
           "check_options", "declared_options", "find_option", "get", "option_choices",
           "options_for", "register", "score_edges"]
