"""One matplotlib look for every mechsink figure.

Figure functions wrap their drawing in :func:`styled` (a context manager, so a user's global
rcParams are untouched afterwards) or are decorated with :func:`use_style`. The palette is
colour-blind safe (Okabe-Ito); heatmaps use ``viridis`` for 0..1 scores and ``RdBu`` centred
on 0 for signed effects. The matplotlib backend is left alone (figures show inline in a
notebook; without a display matplotlib draws with Agg).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import matplotlib.pyplot as plt
from cycler import cycler

PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442",
           "#000000"]
SCORE_CMAP = "viridis"  # scores in [0, 1] (sink score, attention)
SIGNED_CMAP = "RdBu"  # signed effects, centred on 0 (positive blue)
DPI = 110

RC: dict[str, Any] = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "savefig.bbox": "tight",
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.labelsize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
    "grid.alpha": 0.3,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "lines.markersize": 4,
    "image.cmap": SCORE_CMAP,
    "axes.prop_cycle": cycler(color=PALETTE),
}

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def styled() -> Iterator[None]:
    """Draw inside this block with mechsink's style; the caller's rcParams come back after."""
    with plt.rc_context(RC):
        yield


def use_style(fn: F) -> F:
    """Decorator: run a figure function inside :func:`styled`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with styled():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def fit_titles(fig: Any) -> Any:
    """Wrap every title wider than its room (a figure title: the figure; a panel title: its
    panel, with a little slack) onto more lines, so long model names and metric names stay
    inside the figure; returns ``fig``."""
    import textwrap

    renderer = fig.canvas.get_renderer()
    room = [(fig._suptitle, fig.bbox.width * 0.96)] if fig._suptitle is not None else []
    for ax in fig.axes:
        if ax.get_title():
            box = ax.get_window_extent(renderer)
            centre = (box.x0 + box.x1) / 2  # a title is centred on its panel
            half = min(centre, fig.bbox.width - centre)
            room.append((ax.title, 0.96 * min(box.width * 1.15, 2 * half)))
    for text, width in room:
        label = text.get_text()
        extent = text.get_window_extent(renderer).width
        if not label or extent <= width or width <= 0:
            continue
        chars = max(12, int(len(label) * width / extent))
        text.set_text("\n".join(textwrap.wrap(label.replace("\n", " "), chars)))
    return fig


def save(fig: Any, path: Any) -> Any:
    """Save ``fig`` at the house resolution (titles wrapped to fit, :func:`fit_titles`) and
    close it; returns ``path``. A path is written atomically (a temporary file renamed into
    place: an interrupted save leaves no half figure); the format is its suffix (png without)."""
    fit_titles(fig)
    try:
        if hasattr(path, "write"):  # an open file: the caller owns it
            fig.savefig(path, dpi=DPI)
        else:
            from pathlib import Path

            from mechsink.io import atomic_file

            target = Path(path)
            with atomic_file(target) as (_, handle):
                fig.savefig(handle, dpi=DPI, format=target.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return path
