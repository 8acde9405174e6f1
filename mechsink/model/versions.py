"""Which TransformerLens is installed, and the error for one whose bridge mechsink cannot use.

mechsink runs on a TransformerLens 4 bridge, or on a HookedTransformer from any version that
has one (2.x, 3.x); a 3.x bridge cannot run from a layer and is refused with an error that
names both ways out.
"""

from __future__ import annotations

from importlib.metadata import version

from mechsink.errors import MissingDependencyError


def tl_major() -> int:
    """TransformerLens's major version (2, 3, 4, ...)."""
    try:
        return int(version("transformer-lens").split(".")[0])
    except Exception:  # pragma: no cover - an unusual install: assume the newest behaviour
        return 99


def old_bridge_error() -> MissingDependencyError:
    """The error for a TransformerLens whose bridge mechsink cannot use (none, or 3.x's)."""
    have = version("transformer-lens")
    why = ("has no TransformerBridge" if tl_major() < 3
           else "has a bridge that cannot run from a layer")
    return MissingDependencyError(
        f"mechsink's TransformerBridge support needs TransformerLens 4 (this is {have}, which "
        f"{why}): install "
        "'transformer-lens>=4.3,<5', or keep this TransformerLens and pass a HookedTransformer "
        "(built with fold_ln=False, center_writing_weights=False, center_unembed=False for the "
        "raw weights' residual stream)."
    )
