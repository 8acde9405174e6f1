"""Edge-scoring methods behind a registry, one file each (as auto-circuit's ``prune_algos/``).

A method is a function ``fn(run, **options) -> EdgeScores`` registered by name with
:func:`register`; it may use the :class:`~mechsink.discover.graph_run.GraphRun` interface its
docstring lists and the shared steps of :mod:`mechsink.discover.scores`. Every module of this
package is imported when the registry is first read, so adding a method is adding one file:

.. code-block:: python

    from mechsink.discover.methods import register
    from mechsink.discover.scores import EdgeScores, result

    @register("mine")
    def mine(run, *, verify: int = 20) -> EdgeScores:
        ...

:func:`~mechsink.discover.pipeline.discover` and ``mechsink discover --method`` read the
registry; a method receives the options it declares (its keyword-only parameters).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mechsink.errors import BadInputError


@dataclass(frozen=True)
class Method:
    """A registered method: its ``name``, the function, the options it takes and, for options
    that take one of a few names, those names (``choices``: option -> allowed values)."""

    name: str
    fn: Callable[..., Any]
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def options(self) -> tuple[str, ...]:
        """The keyword-only parameters of ``fn`` (what the pipeline and the CLI may pass)."""
        params = inspect.signature(self.fn).parameters.values()
        return tuple(p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY)

    @property
    def summary(self) -> str:
        """The first line of the method's docstring."""
        return (inspect.getdoc(self.fn) or self.name).splitlines()[0]


_REGISTRY: dict[str, Method] = {}
_loaded = False


def register(name: str, *, choices: Mapping[str, Sequence[str]] | None = None
             ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(run, **options) -> EdgeScores`` as method ``name`` (a decorator);
    ``choices``: the values each option that takes a name allows (the command line and the
    sweep check them before any model loads)."""
    allowed = {k: tuple(v) for k, v in (choices or {}).items()}

    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"a discovery method {name!r} is already registered.")
        unknown = sorted(set(allowed) - set(Method(name, fn).options))
        if unknown:
            raise ValueError(f"method {name!r} declares choices for {', '.join(unknown)}, "
                             "which it does not take.")
        _REGISTRY[name] = Method(name, fn, allowed)
        return fn
    return add


def option_choices() -> dict[str, tuple[str, ...]]:
    """Every registered method's declared choices, option -> allowed values (one option
    declared by two methods must allow the same values)."""
    out: dict[str, tuple[str, ...]] = {}
    for method in METHODS.values():
        for option, values in method.choices.items():
            if out.setdefault(option, values) != values:
                raise ValueError(f"option {option!r} allows {out[option]} in one method and "
                                 f"{values} in {method.name!r}.")
    return out


def _load() -> None:
    """Import every module of this package once (each registers its method)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for info in pkgutil.iter_modules(__path__):
            importlib.import_module(f"{__name__}.{info.name}")


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


def score_edges(run: Any, method: str, **options: Any) -> Any:
    """Score every edge of ``run`` with the method called ``method``; ``options`` it does not
    take are refused (use :func:`options_for` to pick a method's own from a larger set)."""
    m = get(method)
    unknown = sorted(set(options) - set(m.options))
    if unknown:
        raise BadInputError(f"method {method!r} takes {', '.join(m.options) or 'no options'}, "
                            f"not {', '.join(unknown)}.")
    return m.fn(run, **options)


def options_for(method: str, options: dict[str, Any]) -> dict[str, Any]:
    """The entries of ``options`` that method ``method`` takes."""
    wanted = set(get(method).options)
    return {k: v for k, v in options.items() if k in wanted}


__all__ = ["METHODS", "Method", "get", "option_choices", "options_for", "register",
           "score_edges"]
