"""How a job declares its options: a dataclass field per option, with its default, its help
and the types its sweep table takes; and the error a check raises, naming the option."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mechsink.errors import BadInputError, MechsinkError

NUM = (int, float)


def setting(default: Any, types: tuple[type, ...], help: str = "", *, sweep: bool = True,
            required: bool = False) -> Any:
    """A spec field: ``default`` (a list is kept as a tuple), the ``types`` a sweep's TOML
    value may have, ``help`` for the command line; ``sweep=False``: the sweep table does not
    take it; ``required``: the sweep table must give it."""
    meta = {"types": types, "help": help, "sweep": sweep, "required": required}
    if isinstance(default, list):
        default = tuple(default)
    return dataclasses.field(default=default, metadata=meta)


def default(spec: type, name: str) -> Any:
    """The default of option ``name`` of spec class ``spec`` (one source for every front)."""
    return {f.name: f.default for f in dataclasses.fields(spec)}[name]


def help_of(spec: type, name: str) -> str:
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(spec)}[name]


def sweep_table(spec: type, overrides: dict[str, Any] | None = None
                ) -> dict[str, tuple[tuple[type, ...], Any]]:
    """The settings a sweep's ``[job]`` table takes: name -> (accepted types, default), the
    default as plain JSON (tuples as lists); ``overrides``: defaults that differ in a sweep."""
    out = {}
    for f in dataclasses.fields(spec):
        if not f.metadata.get("sweep", True):
            continue
        value = (overrides or {}).get(f.name, f.default)
        out[f.name] = (f.metadata["types"], list(value) if isinstance(value, tuple) else value)
    return out


def required(spec: type) -> set[str]:
    """The settings a sweep table must give."""
    return {f.name for f in dataclasses.fields(spec) if f.metadata.get("required")}


def from_settings(spec: type, settings: dict[str, Any]) -> Any:
    """A spec from a sweep's settings (extra keys, such as a shard's pairs, left out); a spec
    class with a ``from_settings`` classmethod of its own gathers them itself."""
    own = getattr(spec, "from_settings", None)
    if own is not None:
        return own(settings)
    names = {f.name for f in dataclasses.fields(spec)}
    return spec(**{k: v for k, v in settings.items() if k in names})


class SettingError(BadInputError):
    """A bad value of one option: the message, the option's ``key`` and the ``table`` it
    belongs to (the sweep names the spec's line from them; None: the spec's top level);
    ``bare``: the message reads whole, without the table's name before it."""

    def __init__(self, message: str, key: str | None, table: str | None = "", *,
                 bare: bool = False) -> None:
        super().__init__(message)
        self.key = key
        self.table = table
        self.bare = bare


def at(key: str | None, check: Callable[..., Any], *args: Any, table: str | None = "",
       **kwargs: Any) -> Any:
    """Run ``check``; a mechsink error it raises becomes a :class:`SettingError` of ``key``."""
    try:
        return check(*args, **kwargs)
    except SettingError:
        raise
    except MechsinkError as exc:
        raise SettingError(str(exc), key, table) from None


def sweep_name(key: str) -> str:
    """An option as a sweep spec names it (``seq_len``)."""
    return key


def cli_name(key: str) -> str:
    """An option as the command line names it (``--seq-len``)."""
    return "--" + key.replace("_", "-")


def parse_numbers(text: str | None, option: str, what: str = "layer") -> tuple[int, ...] | None:
    """``"0,2,5"`` -> (0, 2, 5); None stays None; anything else is an error naming ``option``
    and ``what`` the numbers are (layer, position)."""
    if text is None:
        return None
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise MechsinkError(f"{option} takes comma-separated {what} numbers such as 0,2,5; "
                            f"got {text!r}.") from None
    if any(v < 0 for v in values):
        raise MechsinkError(f"{option}: {what} numbers start at 0, got {text!r}.")
    return values
