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
from mechsink.names import KINDS, UNIT_WORDS, Name, axis_size, kv_head_of, parse_name

#: what a site can patch: :data:`mechsink.names.KINDS`'s kinds (``"neuron"`` is the site word
#: for ``post``, the MLP's neurons at ``mlp.hook_post``)
SITE_KINDS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v",
              "pattern", "neuron")
_NAMES_KIND = {"neuron": "post"}
_SITE_KIND = {v: k for k, v in _NAMES_KIND.items()}
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
    """``resid`` (whole d_model vectors), ``head``, ``pattern`` or ``neuron``, from the table."""
    k = KINDS[_NAMES_KIND.get(kind, kind)]
    if k.unit == "channel":
        return "resid"
    if k.pos_dim != 1:
        return "pattern"
    return "neuron" if k.unit == "neuron" else "head"


@dataclass(frozen=True)
class Site:
    """An activation kind at a granularity, optionally restricted to some indices.

    ``granularity``: ``"by_pos"`` (one patch per position, the default), ``"all_pos"`` (every
    position at once) or, for ``pattern`` only, ``"dest_src"`` (one patch per query/key pair).
    ``layers``/``units``/``positions``: None = all. ``units`` lie on the kind's unit axis
    (:data:`mechsink.names.KINDS`): heads (``z``, ``q``, ``pattern``), KV heads (``k``, ``v``;
    fewer than heads on GQA models) or neurons (``neuron``). ``via_head``: the units of a
    ``k``/``v`` site are query heads, each standing for the KV head it reads (``"L3H5.k"``).
    Negative positions count from the end.
    """

    kind: str
    granularity: str = "by_pos"
    layers: tuple[int, ...] | None = None
    units: tuple[int, ...] | None = None
    positions: tuple[int, ...] | None = None
    via_head: bool = False
    _resolved: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in SITE_KINDS:
            raise BadInputError(
                f"unknown site {self.kind!r}: choose one of {', '.join(SITE_KINDS)}."
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

    @property
    def names_kind(self) -> str:
        """The kind in :data:`mechsink.names.KINDS` (``post`` for the ``neuron`` site)."""
        return _NAMES_KIND.get(self.kind, self.kind)

    def hook_name(self, layer: int) -> str:
        """The hook this site patches at ``layer``."""
        return Name(self.names_kind, layer).hook

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

        Raises :class:`BadInputError` naming the first out-of-range index, or the hook the
        model does not have (a KeyError deep in the sweep before).
        """
        Name(self.names_kind, 0).check(model)
        cfg = model.cfg
        own = KINDS[self.names_kind].unit or "channel"
        # units named by query heads are checked as heads, then become the KV heads they read
        unit_axis = "head" if self.via_head and self.units is not None else own
        ranges = {
            "layer": ("layers", int(cfg.n_layers), "layer"),
            "head": ("units", axis_size(model, unit_axis), UNIT_WORDS[unit_axis]),
            "pos": ("positions", seq_len, "position"),
            "dest_pos": ("positions", seq_len, "position"),
            "src_pos": ("positions", seq_len, "position"),
            "neuron": ("units", axis_size(model, "neuron"), "neuron"),
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
            if axis == "head" and unit_axis != own:
                out = list(dict.fromkeys(kv_head_of(model, h) for h in out))
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


_GRAN_RE = re.compile(r"^(?P<base>.+?)_(?P<gran>by_pos|all_pos|dest_src)$")
_RESTRICTIONS = ("layers", "units", "positions")


def parse_site(spec: Any, **restrict: Any) -> Site:
    """A :class:`Site` from any name form of :mod:`mechsink.names`, optionally followed by
    ``_by_pos`` (default), ``_all_pos`` or (pattern only) ``_dest_src``.

    ``"z"``, ``"attn.hook_z"``, ``"blocks.3.attn.hook_z"`` (layer 3 only), ``("z", 3)``,
    ``"L3H5@0"`` (layer 3, head 5, position 0), ``"L3N7"``, ``"MLP3_all_pos"``, ``"neuron"``
    (``mlp.hook_post``). ``restrict``: ``layers``, ``units``, ``positions`` (the name's own
    layer/unit/position must not also be given there).
    """
    unknown = sorted(set(restrict) - set(_RESTRICTIONS))
    if unknown:
        raise BadInputError(f"parse_site: unknown restriction {', '.join(unknown)}=: restrict a "
                            "site with layers=, units= (heads, KV heads or neurons) or "
                            "positions=.")
    if isinstance(spec, Site):
        return replace(spec, **restrict) if restrict else spec
    gran = "by_pos"
    base: Any = spec
    if isinstance(spec, str):
        base = spec.strip()
        m = _GRAN_RE.match(base)
        if m is not None:
            base, gran = m["base"], m["gran"]
    if base == "neuron":
        return Site("neuron", gran, **restrict)
    try:
        name = parse_name(base)
    except BadInputError as exc:
        raise BadInputError(
            f"unknown site {spec!r}: choose one of {', '.join(SITE_KINDS)} (or any hook name: "
            "attn.hook_z, blocks.3.hook_mlp_out, L3H5@0, MLP3, ...), optionally followed by "
            "_by_pos, _all_pos or (pattern only) _dest_src."
        ) from exc
    kind = _SITE_KIND.get(name.kind, name.kind)
    if kind not in SITE_KINDS:
        raise BadInputError(
            f"{spec!r} names {name.hook_at(name.layer or 0)}, which is not a patching "
            f"site: choose one of {', '.join(SITE_KINDS)}.")
    for attr, value in (("layers", name.layer), ("units", name.unit),
                        ("positions", name.position)):
        if value is None:
            continue
        if restrict.get(attr) is not None and tuple(restrict[attr]) != (value,):
            raise BadInputError(f"site {spec!r} already names its {attr[:-1]} ({value}): "
                                f"drop {attr}= or the {attr[:-1]} in the name.")
        restrict[attr] = (value,)
    return Site(kind, gran, via_head=name.via_head, **restrict)
