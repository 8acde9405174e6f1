"""mechsink: measure, trace and intervene on attention sinks, built on TransformerLens."""

from mechsink.errors import (
    AssetError,
    BadInputError,
    MechsinkError,
    MissingDependencyError,
    UnknownModelError,
)
from mechsink.model import list_models, load_model, save_organism, wrap

__version__ = "0.1.0"

__all__ = [
    "AssetError",
    "BadInputError",
    "MechsinkError",
    "MissingDependencyError",
    "UnknownModelError",
    "list_models",
    "load_model",
    "save_organism",
    "wrap",
    "__version__",
]
