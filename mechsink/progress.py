"""Progress bars for the long calls: patching sweeps, path patching, the census, model loads.

One switch for all of them, checked in this order:

1. :func:`set_progress` (``True`` always, ``False`` never, ``None`` back to automatic), or the
   :func:`progress_disabled` context;
2. the environment variable ``MECHSINK_PROGRESS`` (``0``/``off``/``false`` or ``1``/``on``);
3. automatic: shown on a terminal and in a Jupyter kernel, silent otherwise (pipes, logs, CI).

In Jupyter the bar is tqdm's notebook widget when ipywidgets is installed, else a text bar.
A bar appears only once its call has run for ``delay`` seconds, so quick calls print nothing.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ENV = "MECHSINK_PROGRESS"
#: seconds a call runs before its bar appears (quick calls print nothing)
DELAY = 2.0
_setting: bool | None = None


def set_progress(enabled: bool | None) -> None:
    """Show progress bars always (``True``), never (``False``) or automatically (``None``)."""
    global _setting
    if enabled is not None and not isinstance(enabled, bool):
        from mechsink.errors import BadInputError

        raise BadInputError(f"set_progress takes True, False or None, got {enabled!r}.")
    _setting = enabled


@contextmanager
def progress_disabled() -> Iterator[None]:
    """No progress bars inside the ``with`` block (the previous setting comes back after)."""
    global _setting
    before = _setting
    _setting = False
    try:
        yield
    finally:
        _setting = before


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (where stderr is no terminal but bars show)."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except Exception:  # IPython missing or broken: not a notebook we can draw in
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def enabled() -> bool:
    """Whether a bar started now would show (see the module docstring for the order)."""
    if _setting is not None:
        return _setting
    env = os.environ.get(ENV, "").strip().lower()
    if env in ("0", "off", "false", "no"):
        return False
    if env in ("1", "on", "true", "yes"):
        return True
    stream = sys.stderr
    return in_notebook() or bool(getattr(stream, "isatty", lambda: False)())


def bar(total: int | None, desc: str, *, unit: str = "it", delay: float | None = None) -> Any:
    """A tqdm bar (use as a context manager, ``.update(n)``), disabled when bars are off;
    it appears after ``delay`` seconds (default :data:`DELAY`)."""
    show = enabled()
    delay = DELAY if delay is None else delay
    if show and in_notebook():
        try:
            import ipywidgets  # noqa: F401
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False)
        except ImportError:
            pass
    from tqdm.std import tqdm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False,
                    disable=not show, file=sys.stderr, dynamic_ncols=True)


@contextmanager
def library_bars() -> Iterator[None]:
    """Let transformers and huggingface_hub show their own bars (weight loading, file
    reading) only when mechsink's bars are on; their setting is restored afterwards."""
    show = enabled()
    restore = []
    try:
        from transformers.utils import logging as hf_logging

        was = hf_logging.is_progress_bar_enabled()
        (hf_logging.enable_progress_bar if show else hf_logging.disable_progress_bar)()
        restore.append(hf_logging.enable_progress_bar if was else hf_logging.disable_progress_bar)
    except Exception:  # transformers absent or its API moved: leave its bars alone
        pass
    try:
        yield
    finally:
        for undo in restore:
            undo()
