"""Progress bars for the long calls: patching sweeps, path patching, the census, model loads.

One switch for all of them, checked in this order:

1. :func:`set_progress` (``True`` always, ``False`` never, ``None`` back to automatic), or the
   :func:`progress_disabled` context;
2. the environment variable ``MECHSINK_PROGRESS`` (``0``/``off``/``false`` or ``1``/``on``);
3. automatic: a bar on a terminal and in a Jupyter kernel; elsewhere (a log, a pipe, CI) one
   line per phase on stderr when it ends, with its count and time
   (``census: 96/96 seq in 41.3 s``).

In Jupyter the bar is ``tqdm.auto``'s widget (a text bar without ipywidgets), left at its
final state when it closes so an executed notebook shows each bar finished. A bar (or a log
line) appears only once its call has run for ``delay`` seconds, so quick calls print nothing.
:func:`phase` times a step that has no count (a model load) the same way.
"""

from __future__ import annotations

import os
import sys
import time
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


def mode() -> str:
    """How progress shows now: ``"off"``, ``"notebook"`` (a widget), ``"terminal"`` (a bar) or
    ``"log"`` (a line per phase; automatic when stderr is no terminal)."""
    if _setting is False:
        return "off"
    env = os.environ.get(ENV, "").strip().lower()
    if _setting is None and env in ("0", "off", "false", "no"):
        return "off"
    if in_notebook():
        return "notebook"
    forced = _setting is True or env in ("1", "on", "true", "yes")
    tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
    return "terminal" if tty or forced else "log"


def enabled() -> bool:
    """Whether a bar started now would show as a bar or widget (see the module docstring)."""
    return mode() in ("notebook", "terminal")


class LogLine:
    """A progress "bar" for logs: counts silently, then writes one line to stderr when it
    closes, if its phase ran for at least ``delay`` seconds (tqdm's methods, for callers)."""

    def __init__(self, total: int | None, desc: str, unit: str, delay: float) -> None:
        self.total, self.desc, self.unit, self.delay = total, desc, unit, delay
        self.n, self.postfix, self.start, self.closed = 0, "", time.perf_counter(), False

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def line(self) -> str:
        took = time.perf_counter() - self.start
        count = f"{self.n}/{self.total}" if self.total is not None else str(self.n)
        extra = f" ({self.postfix})" if self.postfix else ""
        return f"{self.desc}: {count} {self.unit} in {took:.1f} s{extra}"

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if time.perf_counter() - self.start >= self.delay:
            print(self.line(), file=sys.stderr, flush=True)

    def __enter__(self) -> LogLine:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def bar(total: int | None, desc: str, *, unit: str = "it", delay: float | None = None) -> Any:
    """A progress bar (use as a context manager, ``.update(n)``): a widget in Jupyter, a tqdm
    bar on a terminal, one line at the end in a log, nothing when off; it appears after
    ``delay`` seconds (default :data:`DELAY`)."""
    how = mode()
    delay = DELAY if delay is None else delay
    if how == "log":
        return LogLine(total, desc, unit, delay)
    if how == "notebook":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from tqdm.auto import tqdm as auto_tqdm

            return auto_tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=True)
    from tqdm.std import tqdm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tqdm(total=total, desc=desc, unit=unit, delay=delay, leave=False,
                    disable=how == "off", file=sys.stderr, dynamic_ncols=True)


@contextmanager
def phase(desc: str, *, delay: float | None = None) -> Iterator[None]:
    """Time a step without a count (a model load): in a log, one line when it ends
    (``loading smollm2-135m: 9.8 s``) if it ran for ``delay`` seconds; elsewhere nothing
    (terminals and notebooks have the caller's own spinner or output)."""
    start = time.perf_counter()
    try:
        yield
    finally:
        took = time.perf_counter() - start
        if mode() == "log" and took >= (DELAY if delay is None else delay):
            print(f"{desc}: {took:.1f} s", file=sys.stderr, flush=True)


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
