"""Patch sites: which activation to overwrite, and the grid of patches a sweep over it makes.

A :class:`Site` names a hook kind (``resid_pre``, ``z``, ``pattern``, ``neuron``, ...) and a
granularity (whole layer/head, or per position). It enumerates its patches: one each, an index
tuple laid out like ``transformer_lens.patching``'s output (``resid_pre`` by position is
``[layer, pos]``, head ``z`` by position is ``[layer, pos, head]``, ...). A site can be
restricted to chosen ``layers``, ``units`` (heads, or neurons for ``neuron``) and ``positions``.

:func:`parse_site` reads every name form of :mod:`mechsink.names` (``"z"``,
``"attn.hook_z"``, ``"blocks.3.attn.hook_z"``, ``("z", 3)``, ``"L3H5@0"``, ``"MLP3"``, ...); a
layer, unit or position in the name restricts the site to it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from jaxtyping import Bool
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model import act_name, n_kv_heads
from mechsink.names import deprecated, parse_name

# kind -> hook name inside a block (full names through mechsink.model.bridge.act_name)
HOOKS: dict[str, str] = {
    "resid_pre": "hook_resid_pre",
    "resid_mid": "hook_resid_mid",
    "resid_post": "hook_resid_post",
    "attn_out": "hook_attn_out",
    "mlp_out": "hook_mlp_out",
    "z": "attn.hook_z",
    "q": "attn.hook_q",
    "k": "attn.hook_k",
    "v": "attn.hook_v",
    "pattern": "attn.hook_pattern",
    "neuron": "mlp.hook_post",
}
RESID_KINDS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
HEAD_KINDS = ("z", "q", "k", "v")
GRANULARITIES = ("all_pos", "by_pos", "dest_src")

# axis layout per (kind family, granularity): matches transformer_lens.patching's outputs
_AXES: dict[tuple[str, str], tuple[str, ...]] = {
    ("resid", "all_pos"): ("layer",),
    ("resid", "by_pos"): ("layer", "pos"),
    ("head", "all_pos"): ("layer", "head"),
    ("head", "by_pos"): ("layer", "pos", "head"),
    ("pattern", "all_pos"): ("layer", "head"),
    ("pattern", "by_pos"): ("layer", "head", "dest_pos"),
    ("pattern", "dest_src"): ("layer", "head", "dest_pos", "src_pos"),
    ("neuron", "all_pos"): ("layer", "neuron"),
    ("neuron", "by_pos"): ("layer", "pos", "neuron"),
}


def _family(kind: str) -> str:
    if kind in RESID_KINDS:
        return "resid"
    if kind in HEAD_KINDS:
        return "head"
    return kind


@dataclass(frozen=True)
class Site:
    """An activation kind at a granularity, optionally restricted to some indices.

    ``granularity``: ``"by_pos"`` (one patch per position, the default), ``"all_pos"`` (every
    position at once) or, for ``pattern`` only, ``"dest_src"`` (one patch per query/key pair).
    ``layers``/``units``/``positions``: None = all. ``units`` are heads (``z``, ``q``, ``k``,
    ``v``, ``pattern``; KV heads for ``k``/``v`` on GQA models) or neurons (``neuron``).
    Negative positions count from the end. ``heads=``/``neurons=`` are the old names of
    ``units=`` (deprecated, one release).
    """

    kind: str
    granularity: str = "by_pos"
    layers: tuple[int, ...] | None = None
    units: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None
    heads: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    neurons: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    _resolved: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for old in ("heads", "neurons"):
            value = getattr(self, old)
            if value is None:
                continue
            deprecated(f"Site({old}=...)", "Site(units=...)", stacklevel=5)
            if self.units is not None:
                raise BadInputError(f"give units= only ({old}= is its old name).")
            object.__setattr__(self, "units", value)
            object.__setattr__(self, old, None)
        if self.kind not in HOOKS:
            raise BadInputError(
                f"unknown site {self.kind!r}: choose one of {', '.join(HOOKS)}."
            )
        if self.granularity not in GRANULARITIES:
            raise BadInputError(
                f"unknown granularity {self.granularity!r}: use by_pos, all_pos or dest_src."
            )
        if self.granularity == "dest_src" and self.kind != "pattern":
            raise BadInputError("granularity 'dest_src' only applies to the 'pattern' site.")
        for name in ("layers", "units", "positions"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(int(v) for v in value))

    @property
    def family(self) -> str:
        """``resid`` (d_model vectors), ``head``, ``pattern`` or ``neuron``."""
        return _family(self.kind)

    @property
    def axes(self) -> tuple[str, ...]:
        """Names of the result's axes, in order."""
        return _AXES[(self.family, self.granularity)]

    @property
    def label(self) -> str:
        """A short name such as ``z_by_pos`` (used in results and file names)."""
        return f"{self.kind}_{self.granularity}"

    def hook_name(self, layer: int) -> str:
        """The hook this site patches at ``layer``."""
        return act_name(HOOKS[self.kind], layer)

    def first_position(self, unit: tuple[int, ...]) -> int:
        """The earliest sequence position ``unit`` patches (0 when it patches every one).

        In a causal model nothing before it changes: the engine reuses that prefix.
        """
        idx = dict(zip(self.axes, unit, strict=True))
        for axis in ("pos", "dest_pos"):
            if axis in idx:
                return int(idx[axis])
        if self.granularity == "all_pos" and self.positions is not None:
            return min(self._resolved["pos"])
        return 0

    def resolve(self, model: Any, seq_len: int) -> Site:
        """Check every index against the model and sequence; return a site with full ranges.

        Raises :class:`BadInputError` naming the first out-of-range index.
        """
        cfg = model.cfg
        n_heads = n_kv_heads(model) if self.kind in ("k", "v") else int(cfg.n_heads)
        head_word = "KV head" if self.kind in ("k", "v") and n_heads != cfg.n_heads else "head"
        d_mlp = int(cfg.d_mlp or 0)
        ranges = {
            "layer": ("layers", int(cfg.n_layers), "layer"),
            "head": ("units", n_heads, head_word),
            "pos": ("positions", seq_len, "position"),
            "dest_pos": ("positions", seq_len, "position"),
            "src_pos": ("positions", seq_len, "position"),
            "neuron": ("units", d_mlp, "neuron"),
        }
        resolved: dict[str, tuple[int, ...]] = {}
        needed = set(self.axes)
        if self.granularity == "all_pos" and self.positions is not None:
            needed.add("pos")  # all_pos restricted to some positions: patch those together
        for axis in needed:
            attr, size, word = ranges[axis]
            chosen = getattr(self, attr)
            if chosen is None:
                resolved[axis] = tuple(range(size))
                continue
            if not chosen:
                raise BadInputError(f"site {self.label}: the list of {attr} is empty.")
            out = []
            for v in chosen:
                w = v + size if axis in ("pos", "dest_pos", "src_pos") and v < 0 else v
                if not 0 <= w < size:
                    raise BadInputError(
                        f"site {self.label}: {word} {v} is out of range (this model/prompt has "
                        f"{size} {word}s, numbered 0..{size - 1})."
                    )
                out.append(w)
            resolved[axis] = tuple(out)
        if self.units is not None and not {"head", "neuron"} & set(self.axes):
            raise BadInputError(f"site {self.label} has no unit axis (heads or neurons): "
                                "drop units=.")
        site = replace(self)
        object.__setattr__(site, "_resolved", resolved)
        return site

    def axis_values(self) -> dict[str, tuple[int, ...]]:
        """Index values along each result axis (after :meth:`resolve`)."""
        if not self._resolved:
            raise RuntimeError("call Site.resolve(model, seq_len) first")
        return {a: self._resolved[a] for a in self.axes}

    def patches(self) -> list[tuple[int, ...]]:
        """Every patch as an index tuple along :attr:`axes` (layer first)."""
        values = self.axis_values()
        return list(itertools.product(*(values[a] for a in self.axes)))

    def mask(
        self, unit: tuple[int, ...], act_shape: Sequence[int]
    ) -> Bool[Tensor, "..."]:
        """Boolean mask over one activation (no batch axis) that is True where ``unit`` patches.

        Activation layouts: resid ``[pos, d]``, head ``[pos, head, d_head]``, pattern
        ``[head, dest, src]``, neuron ``[pos, d_mlp]``.
        """
        idx = dict(zip(self.axes, unit, strict=True))
        m = torch.zeros(tuple(act_shape), dtype=torch.bool)
        all_pos = self._resolved.get("pos") if self.granularity == "all_pos" else None
        pos: Any = idx.get("pos", slice(None))
        if all_pos is not None and self.positions is not None:
            pos = list(all_pos)
        fam = self.family
        if fam == "resid":
            m[pos] = True
        elif fam == "head":
            m[pos, idx["head"]] = True
        elif fam == "pattern":
            dest: Any = idx.get("dest_pos", slice(None))
            if all_pos is not None and self.positions is not None:
                dest = list(all_pos)
            m[idx["head"], dest, idx.get("src_pos", slice(None))] = True
        else:
            m[pos, idx["neuron"]] = True
        return m


_GRAN_RE = re.compile(r"^(?P<base>.+?)(?P<sep>[_:@])(?P<gran>by_pos|all_pos|all|pos|dest_src)$")
# mechsink-only site words of earlier releases -> the name they stand for
_OLD_KINDS = {"head": "z", "attn_head": "z", "neurons": "neuron"}
# Name.kind (TransformerLens's short name) -> Site.kind
_SITE_KIND = {"post": "neuron"}


def parse_site(spec: Any, **restrict: Any) -> Site:
    """A :class:`Site` from any name form of :mod:`mechsink.names`, optionally followed by
    ``_by_pos`` (default), ``_all_pos`` or (pattern only) ``_dest_src``.

    ``"z"``, ``"attn.hook_z"``, ``"blocks.3.attn.hook_z"`` (layer 3 only), ``("z", 3)``,
    ``"L3H5@0"`` (layer 3, head 5, position 0), ``"L3N7"``, ``"MLP3_all_pos"``, ``"neuron"``
    (``mlp.hook_post``). ``restrict``: ``layers``, ``units``, ``positions`` (the name's own
    layer/unit/position must not also be given there).
    """
    if isinstance(spec, Site):
        return replace(spec, **restrict) if restrict else spec
    gran = "by_pos"
    base: Any = spec
    if isinstance(spec, str):
        base = spec.strip()
        m = _GRAN_RE.match(base)
        if m is not None:
            base, gran = m["base"], m["gran"]
            canonical = {"all": "all_pos", "pos": "by_pos"}.get(gran, gran)
            if m["sep"] != "_" or gran != canonical:
                deprecated(f"site {spec!r}", f"{base}_{canonical!s}")
            gran = canonical
        if base.lower() in _OLD_KINDS:
            new = _OLD_KINDS[base.lower()]
            deprecated(f"site {base!r}", repr(new if new != "z" else "z (or attn.hook_z)"))
            base = new
    if base == "neuron":
        kind, name = "neuron", None
    else:
        try:
            name = parse_name(base)
        except BadInputError as exc:
            raise BadInputError(
                f"unknown site {spec!r}: choose one of {', '.join(HOOKS)} (or any hook name: "
                "attn.hook_z, blocks.3.hook_mlp_out, L3H5@0, MLP3, ...), optionally followed by "
                "_by_pos, _all_pos or (pattern only) _dest_src."
            ) from exc
        kind = _SITE_KIND.get(name.kind, name.kind)
        if kind not in HOOKS:
            raise BadInputError(
                f"{spec!r} names {name.hook_at(name.layer or 0)}, which is not a patching "
                f"site: choose one of {', '.join(HOOKS)}.")
    if name is not None:
        for attr, value in (("layers", name.layer), ("units", name.unit),
                            ("positions", name.position)):
            if value is None:
                continue
            if restrict.get(attr) is not None and tuple(restrict[attr]) != (value,):
                raise BadInputError(f"site {spec!r} already names its {attr[:-1]} ({value}): "
                                    f"drop {attr}= or the {attr[:-1]} in the name.")
            restrict[attr] = (value,)
    return Site(kind, gran, **restrict)
