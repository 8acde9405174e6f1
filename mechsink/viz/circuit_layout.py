"""Where a circuit's nodes sit (embedding, each layer's heads, its MLP, the metric) and the colour
of each receiving input: shared by the static figure (:mod:`mechsink.viz.discover`) and the
interactive page (:mod:`mechsink.viz.circuit_html`)."""

from __future__ import annotations

import math
import re

_HEAD = re.compile(r"^L(\d+)(H|KV)(\d+)(?:\.([qkv]))?$")
_MLP = re.compile(r"^MLP(\d+)$")
_NEURON = re.compile(r"^L(\d+)N(\d+)$")
KIND_COLOURS = {"q": "#0072B2", "k": "#E69F00", "v": "#009E73", "mlp": "#CC79A7",
                "metric": "#D55E00"}


def mlp_row(n_heads: int) -> float:
    """The row MLPs sit on: their own, above every head's (never on a head's row)."""
    return n_heads + 0.5


def _position(name: str, n_heads: int, n_layers: int, group: int) -> tuple[float, float]:
    """x = stage (embed 0, heads of layer L at 2L+1, MLP L at 2L+2, metric last); y = head,
    MLPs on a row of their own above the heads (:func:`mlp_row`), their neurons above it."""
    if name == "embed":
        return 0.0, (n_heads - 1) / 2
    if name == "metric":
        return 2.0 * n_layers + 1, (n_heads - 1) / 2
    m = _MLP.match(name)
    if m:
        return 2.0 * int(m[1]) + 2, mlp_row(n_heads)
    m = _NEURON.match(name)  # a neuron sender (discovery's neurons=): above its MLP
    if m:
        return 2.0 * int(m[1]) + 2, mlp_row(n_heads) + 0.75 + int(m[2]) % 7 * 0.25
    m = _HEAD.match(name)
    if m is None:
        raise ValueError(f"cannot place node {name!r}")
    layer, kind, idx = int(m[1]), m[2], int(m[3])
    y = idx * group + (group - 1) / 2 if kind == "KV" else idx
    return 2.0 * layer + 1, float(y)


def _num(x: float | None, none: float = math.nan) -> float:
    """A number from JSON, ``none`` for null."""
    return none if x is None else float(x)
