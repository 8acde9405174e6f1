"""mechsink: measure, trace and intervene on attention sinks, built on TransformerLens.

The model functions and the subpackages are imported on first use (module ``__getattr__``,
PEP 562), so ``import mechsink`` and the command line start without torch and TransformerLens;
``mechsink.load_model``, ``mechsink.viz.attention(...)`` and the rest work as attributes.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mechsink.errors import (
    AssetError,
    BadInputError,
    MechsinkError,
    MissingDependencyError,
    UnknownModelError,
)

if TYPE_CHECKING:  # what the lazy attributes are, for type checkers and editors
    from mechsink import viz
    from mechsink.model import list_models, load_model, save_organism, wrap

__version__ = "0.2.0"  # the package version (pyproject.toml reads it from here)

_FROM_MODEL = ("list_models", "load_model", "save_organism", "wrap")
_SUBPACKAGES = ("app", "discover", "experiments", "inputs", "interventions", "io", "measure",
                "model", "names", "organisms", "patching", "progress", "training", "viz")

__all__ = [
    "AssetError",
    "BadInputError",
    "MechsinkError",
    "MissingDependencyError",
    "UnknownModelError",
    "list_models",
    "load_model",
    "save_organism",
    "viz",
    "wrap",
    "__version__",
]


def __getattr__(name: str) -> Any:
    """Import a model function or a subpackage the first time it is asked for."""
    if name in _FROM_MODEL:
        value = getattr(importlib.import_module("mechsink.model"), name)
    elif name in _SUBPACKAGES:
        value = importlib.import_module(f"mechsink.{name}")
    else:
        raise AttributeError(f"module 'mechsink' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_SUBPACKAGES))
