"""Edge-scoring methods behind a registry, one file each (as auto-circuit's ``prune_algos/``).

A method is a function ``fn(run, **options) -> EdgeScores`` registered by name with
:func:`register`; it may use the :class:`~mechsink.discover.run.GraphRun` interface its
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mechsink.errors import BadInputError


@dataclass(frozen=True)
class Method:
    """A registered method: its ``name``, the function and the options it takes."""

    name: str
    fn: Callable[..., Any]

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


def register(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(run, **options) -> EdgeScores`` as method ``name`` (a decorator)."""
    def add(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"a discovery method {name!r} is already registered.")
        _REGISTRY[name] = Method(name, fn)
        return fn
    return add


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


__all__ = ["METHODS", "Method", "get", "options_for", "register", "score_edges"]
