"""Path effects and direct effects of the same senders, side by side.

A sender's *path effect* through chosen receivers (path patching: Wang et al. 2022,
"Interpretability in the Wild") and its *direct effect* on the metric (the same path
patching with the receiver ``metric``: every other component frozen) answer different
questions, and they can rank the senders very differently. :func:`path_vs_direct` computes
both with the same inputs and settings and puts them in one frame with their Spearman rank
correlation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mechsink.errors import BadInputError
from mechsink.patching.attribution import correlation
from mechsink.patching.engine import TokensLike
from mechsink.patching.path import path_patch
from mechsink.patching.result import PatchResult


@dataclass(frozen=True)
class EffectComparison:
    """Both results (``path``: through the receivers; ``direct``: to the metric) and the
    Spearman rank correlation of their values over the senders (scipy's)."""

    path: PatchResult
    direct: PatchResult
    receivers: tuple[str, ...]
    spearman: float

    def to_frame(self) -> Any:
        """One row per sender: both effects (value minus the unpatched run's metric) and
        their ranks by absolute size (1 = largest)."""
        import pandas as pd

        base = self.path.clean_value if self.path.direction == "noise" else \
            self.path.corrupted_value
        frame = pd.DataFrame({
            "sender": self.path.labels["sender"],
            "path": (self.path.values - base).tolist(),
            "direct": (self.direct.values - base).tolist(),
        })
        for col in ("path", "direct"):
            frame[f"{col}_rank"] = frame[col].abs().rank(ascending=False, method="min").astype(int)
        frame.attrs["spearman"] = self.spearman
        frame.attrs["receivers"] = list(self.receivers)
        return frame

    def __repr__(self) -> str:
        return (f"EffectComparison({len(self.path.labels['sender'])} senders, metric="
                f"{self.path.metric!r}, receivers={list(self.receivers)}, "
                f"spearman={self.spearman:.3f})")

    def _repr_html_(self) -> str:
        from html import escape

        table = self.to_frame().to_html(index=False, float_format="%.4g")
        return f"<div><b>{escape(repr(self))}</b>{table}</div>"


def path_vs_direct(
    model: Any,
    clean: TokensLike,
    corrupted: TokensLike | None,
    senders: Sequence[Any],
    receivers: Sequence[str],
    metric: Any,
    **kwargs: Any,
) -> EffectComparison:
    """Path-patch every sender through ``receivers`` and straight to the metric (same inputs,
    same ``kwargs`` for :func:`~mechsink.patching.path_patch`: ``direction``, ``ablation``,
    ``scales``, ``prepend_bos``, ...); compare them (:class:`EffectComparison`)."""
    receivers = [receivers] if isinstance(receivers, str) else list(receivers)
    if not receivers or "metric" in receivers:
        raise BadInputError("path_vs_direct: give the receivers of the path effect (not "
                            "'metric': the direct effect is computed alongside).")
    if isinstance(metric, (list, tuple)):
        raise BadInputError("path_vs_direct takes one metric.")
    path = path_patch(model, clean, corrupted, senders, receivers, metric, **kwargs)
    direct = path_patch(model, clean, corrupted, senders, ["metric"], metric, **kwargs)
    assert isinstance(path, PatchResult) and isinstance(direct, PatchResult)
    rho = correlation(path.values, direct.values, "spearman")
    return EffectComparison(path, direct, tuple(str(r) for r in receivers), rho)
