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

#: figures are drawn at most this wide (inches): the width of a page's text column, so a figure
#: is shown at its own size and its text at the size it was set in
PAGE_WIDTH = 7.5
#: the smallest text of any figure, in points at page width
MIN_FONT = 8

RC: dict[str, Any] = {
    "figure.dpi": DPI,
    "savefig.dpi": DPI,
    "savefig.bbox": "tight",
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "xtick.labelsize": MIN_FONT,
    "ytick.labelsize": MIN_FONT,
    "figure.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
    "grid.alpha": 0.3,
    "legend.fontsize": MIN_FONT,
    "legend.title_fontsize": MIN_FONT,
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


def line_styles(n: int) -> list[dict[str, Any]]:
    """``n`` distinct line styles: the palette's colours first, then the same colours dashed,
    then dotted (a plot with more lines than colours repeats no (colour, dash) pair)."""
    dashes = ("-", "--", ":", "-.")
    markers = ("o", "s", "^", "D")
    return [{"color": PALETTE[i % len(PALETTE)], "ls": dashes[(i // len(PALETTE)) % len(dashes)],
             "marker": markers[(i // len(PALETTE)) % len(markers)]} for i in range(n)]


def smallest_text(fig: Any) -> float:
    """The smallest text of ``fig`` in points as a reader sees it at page width (a figure wider
    than :data:`PAGE_WIDTH` is shown shrunk to it)."""
    from matplotlib.text import Text

    shrink = min(1.0, PAGE_WIDTH / fig.get_figwidth())
    sizes = [t.get_fontsize() for t in fig.findobj(Text)
             if t.get_visible() and t.get_text().strip()]
    return min(sizes, default=float("inf")) * shrink


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
