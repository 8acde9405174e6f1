"""One vocabulary for naming a place in the model: every accepted form parses to one :class:`Name`.

:data:`KINDS` is the one table of kinds of place: for each, its hook (relative to the block),
the axis its units lie on (heads, KV heads, neurons, channels or none) and where its activation
holds positions. Patching sites, path-patching senders and receivers, the discovery graph's
nodes and :func:`mechsink.interventions.ablate` are all built on it, and
:func:`unit_count` counts a kind's units on a model.

Everywhere mechsink takes a site, a sender, a receiver or an intervention target
(:func:`mechsink.patching.parse_site`, :func:`mechsink.patching.path_patch`,
:func:`mechsink.interventions.ablate`) it reads the name with :func:`parse_name`, which accepts:

- **TransformerLens hook names**, full (``"blocks.3.attn.hook_z"``, ``"hook_embed"``) or
  relative to a block (``"attn.hook_z"``, ``"hook_mlp_out"``, ``"mlp.hook_post"``);
- **``transformer_lens.utils.get_act_name`` forms**: a short name (``"z"``, ``"pattern"``,
  ``"mlp_out"``, ``"post"``, its aliases ``"attn"``, ``"mlp_post"``, ...), a short name with its
  layer glued on (``"k6"``, ``"pre5"``, ``"scale4ln1"``) or a tuple ``("k", 6)`` /
  ``("k", 6, "attn")``;
- **the short form** for one component: ``L3H5`` (head 5's output, ``hook_z``), ``L3H5.q`` /
  ``.k`` / ``.v`` / ``.pattern`` (that head at another hook: for ``.k`` / ``.v`` the key or
  value head 5 reads, on grouped-query models the KV head of its group), ``L3KV1.k`` / ``.v``
  (KV head 1 itself), ``L3N1229`` (neuron 1229 of ``mlp.hook_post``), ``MLP3``
  (``hook_mlp_out``), ``ATTN3`` (``hook_attn_out``), ``resid3`` (``hook_resid_pre``, the
  residual entering block 3; also ``resid_mid3``, ``resid_post3``), ``embed`` and ``pos_embed``.
  ``resid_mid`` (input + attention output, what the MLP reads) does not exist in a parallel
  attention+MLP block (GPT-J, GPT-NeoX, Falcon, Cohere, Phi): its MLP reads the block's input.

Any form may end in ``@POS`` (one sequence position, negative counts from the end) and a
d_model-wide one in ``:CHANNEL`` (``resid3@0:123``). The canonical form is a :class:`Name`:
``kind`` (TransformerLens's short name), ``layer``, ``unit`` (a head, KV head, neuron or
channel, whichever the kind has) and ``position``; ``Name.hook`` is the TransformerLens hook
name and ``str(name)`` the short form.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from mechsink.errors import BadInputError
from mechsink.model import act_name, n_kv_heads, true_d_mlp
from mechsink.model import tl_get_act_name as _get_act_name
from mechsink.model.hooks import KINDS, Kind


def _is_text(x: Any) -> bool:
    return isinstance(x, str) or (isinstance(x, (list, tuple)) and bool(x)
                                  and all(isinstance(t, str) for t in x))


def explicit_bos(prepend_bos: bool | None, *inputs: Any, where: str) -> bool:
    """``prepend_bos`` as given; text input without it is refused (whether position 0 is BOS
    changes every sink measurement, so it is always a stated choice).

    Token tensors need no answer: they are used as they are.
    """
    if prepend_bos is not None:
        return bool(prepend_bos)
    if any(_is_text(x) for x in inputs):
        raise BadInputError(f"{where}: text input needs prepend_bos=True or prepend_bos=False "
                            "(whether the tokenizer's BOS token goes at position 0).")
    return True


_RELATIVE = {k.hook: k.name for k in KINDS.values() if k.in_block}
_GLOBAL = {k.hook: k.name for k in KINDS.values() if not k.in_block}
#: what one unit of each axis is called in messages
UNIT_WORDS = {"head": "head", "kv_head": "KV head", "neuron": "neuron", "channel": "channel"}

_SHORT = re.compile(
    r"^(?:L(?P<hl>\d+)H(?P<h>\d+)(?:\.(?P<hk>q|k|v|z|pattern|attn_scores|result))?"
    r"|L(?P<kl>\d+)KV(?P<kv>\d+)\.(?P<kk>k|v)"
    r"|L(?P<nl>\d+)N(?P<n>\d+)"
    r"|MLP(?P<ml>\d+)|ATTN(?P<al>\d+)"
    r"|(?P<rk>resid|resid_pre|resid_mid|resid_post)(?P<rl>\d+)"
    r"|(?P<g>embed|pos_embed))$"
)
_TAIL = re.compile(r"^(?P<base>.*?)(?:@(?P<pos>-?\d+))?(?::(?P<ch>\d+))?$")
_FULL = re.compile(r"^blocks\.(?P<layer>\d+)\.(?P<rel>.+)$")


def unit_axis(kind: str) -> str | None:
    """The axis a kind's units lie on (``"head"``, ``"kv_head"``, ``"neuron"``,
    ``"channel"``), None for a kind without units or outside :data:`KINDS`."""
    k = KINDS.get(kind)
    return None if k is None else k.unit


def axis_size(model: Any, axis: str) -> int:
    """How many units an axis has on ``model`` (KV heads: fewer than heads on GQA models)."""
    cfg = model.cfg
    if axis == "head":
        return int(cfg.n_heads)
    if axis == "kv_head":
        return n_kv_heads(model)
    if axis == "neuron":  # the transformers config's width (the bridge's is wrong for OPT, XGLM)
        return int(true_d_mlp(model) or 0)
    if axis == "channel":
        return int(cfg.d_model)
    raise BadInputError(f"unknown unit axis {axis!r}: one of {', '.join(UNIT_WORDS)}.")


def unit_count(model: Any, kind: str) -> int:
    """How many units ``kind`` has on ``model`` (heads, KV heads, neurons or channels; a kind
    outside :data:`KINDS` counts d_model channels)."""
    return axis_size(model, unit_axis(kind) or "channel")


def kv_head_of(model: Any, head: int) -> int:
    """The KV head query head ``head`` reads its keys and values from."""
    return int(head) // (int(model.cfg.n_heads) // n_kv_heads(model))


@dataclass(frozen=True)
class Name:
    """A place in the model: a hook ``kind`` at a ``layer``, optionally one ``unit`` of it (a
    head, KV head, neuron or channel, see :attr:`unit_word`) at one sequence ``position``.

    ``kind`` is TransformerLens's short name (``"z"``, ``"mlp_out"``, ``"post"``, ...) or, for a
    hook outside :data:`KINDS`, its name relative to the block (``"ln1.hook_scale"``).
    ``layer`` None: a kind not tied to a layer yet (``"z"``), or a global hook (``embed``).
    ``via_head``: the unit of a key/value kind is the query head it was named by
    (``L3H5.k``: the KV head head 5 reads); :meth:`unit_on` gives the KV head itself.
    """

    kind: str
    layer: int | None = None
    unit: int | None = None
    position: int | None = None
    via_head: bool = False

    @property
    def relative(self) -> str:
        """The hook name relative to the block (``"attn.hook_z"``), or the global hook name."""
        k = KINDS.get(self.kind)
        return self.kind if k is None else k.hook

    @property
    def is_global(self) -> bool:
        k = KINDS.get(self.kind)
        return k is not None and not k.in_block

    @property
    def hook(self) -> str:
        """The full TransformerLens hook name (``"blocks.3.attn.hook_z"``)."""
        if self.is_global:
            return self.relative
        if self.layer is None:
            raise BadInputError(f"{self.relative!r} lives in every block: give its layer "
                                f"(e.g. blocks.0.{self.relative} or layer=0).")
        return act_name(self.relative, self.layer)

    def hook_at(self, layer: int) -> str:
        """The full hook name of this kind at ``layer`` (a global hook ignores it)."""
        return self.hook if self.is_global else act_name(self.relative, layer)

    @property
    def unit_axis(self) -> str | None:
        """The axis :attr:`unit` counts on: the kind's (:data:`KINDS`), or ``"head"`` for a
        key/value kind named by a query head (``via_head``)."""
        return "head" if self.via_head else unit_axis(self.kind)

    @property
    def unit_word(self) -> str | None:
        """What a unit of this name is: ``"head"``, ``"KV head"``, ``"neuron"``,
        ``"channel"`` or None."""
        axis = self.unit_axis
        return None if axis is None else UNIT_WORDS[axis]

    def unit_on(self, model: Any) -> int | None:
        """The unit on the kind's own axis: for ``L3H5.k`` the KV head query head 5 reads."""
        if self.unit is None or not self.via_head:
            return self.unit
        return kv_head_of(model, self.unit)

    def with_(self, **changes: Any) -> Name:
        """A copy with fields changed (``layer``, ``unit``, ``position``)."""
        return replace(self, **changes)

    def __str__(self) -> str:
        """The short form where one exists (``L3H5@0``), else the hook name (+ ``@pos``)."""
        k, lay, u = self.kind, self.layer, self.unit
        tail = "" if self.position is None else f"@{self.position}"
        if lay is not None and u is not None:
            if k in ("z", "q", "pattern", "attn_scores", "result") or (
                    k in ("k", "v") and self.via_head):
                return f"L{lay}H{u}" + ("" if k == "z" else f".{k}") + tail
            if k in ("k", "v"):
                return f"L{lay}KV{u}.{k}{tail}"
            if k == "post":
                return f"L{lay}N{u}{tail}"
        ch = "" if u is None or self.unit_axis != "channel" else f":{u}"
        if self.is_global and (u is None or ch):
            return f"{k}{tail}{ch}"
        if lay is not None and (u is None or ch):
            short = {"mlp_out": "MLP", "attn_out": "ATTN", "resid_pre": "resid",
                     "resid_mid": "resid_mid", "resid_post": "resid_post"}.get(k)
            if short is not None:
                return f"{short}{lay}{tail}{ch}"
        base = self.kind if lay is None else act_name(self.relative, lay)
        return base + tail + (f"[{self.unit_word} {u}]" if u is not None and not ch else ch)

    def check(self, model: Any, seq_len: int | None = None) -> Name:
        """Raise :class:`BadInputError` unless the model has this hook, layer, unit and position.

        Returns the name with a negative position made absolute (when ``seq_len`` is given).
        """
        cfg = model.cfg
        n_layers = int(cfg.n_layers)
        if self.layer is not None and not 0 <= self.layer < n_layers:
            raise BadInputError(f"{self}: layer {self.layer} is out of range (the model has "
                                f"layers 0..{n_layers - 1}).")
        known = getattr(model, "hook_dict", None)
        if self.kind == "resid_mid" and getattr(cfg, "parallel_attn_mlp", False):
            raise BadInputError(f"{self}: this model's blocks run attention and MLP in parallel "
                                "(the MLP reads the block's input): there is no resid_mid; "
                                "patch resid_pre, attn_out or mlp_out.")
        probe_layer = 0 if self.layer is None else self.layer
        if known is not None and self.hook_at(probe_layer) not in known:
            raise BadInputError(f"{self}: this model has no hook {self.hook_at(probe_layer)!r} "
                                "(see model.hook_dict for the names it has).")
        if self.unit is not None:
            size = axis_size(model, self.unit_axis or "channel")
            if not 0 <= self.unit < size:
                raise BadInputError(f"{self}: {self.unit_word} {self.unit} is out of range "
                                    f"(this hook has {size}, numbered 0..{size - 1}).")
        pos = self.position
        if pos is not None and seq_len is not None:
            if not -seq_len <= pos < seq_len:
                raise BadInputError(f"{self}: position {pos} is outside the sequence "
                                    f"({seq_len} tokens).")
            return replace(self, position=pos + seq_len if pos < 0 else pos)
        return self


def _from_hook(full: str) -> tuple[str, int | None] | None:
    """(kind, layer) of a full or relative TransformerLens hook name, None if it is not one."""
    if full in _GLOBAL:
        return _GLOBAL[full], None
    m = _FULL.match(full)
    rel, layer = (m["rel"], int(m["layer"])) if m else (full, None)
    if rel in _RELATIVE:
        return _RELATIVE[rel], layer
    if re.fullmatch(r"(ln1|ln2|attn|mlp)\.hook_[a-z_]+", rel):
        return rel, layer  # another per-block hook (ln1.hook_scale, ...): kept by its name
    return None


def kind_of_hook(hook: str) -> Kind | None:
    """The :data:`KINDS` entry of a full hook name (None for a hook outside the table)."""
    got = _from_hook(hook)
    return None if got is None else KINDS.get(got[0])


def _short(base: str) -> tuple[str, int | None, int | None, bool] | None:
    """(kind, layer, unit, via_head) of the short form, None if ``base`` is not one."""
    m = _SHORT.match(base)
    if m is None:
        return None
    if m["hl"] is not None:
        kind = m["hk"] or "z"
        return kind, int(m["hl"]), int(m["h"]), unit_axis(kind) == "kv_head"
    if m["kl"] is not None:
        return m["kk"], int(m["kl"]), int(m["kv"]), False
    if m["nl"] is not None:
        return "post", int(m["nl"]), int(m["n"]), False
    if m["ml"] is not None:
        return "mlp_out", int(m["ml"]), None, False
    if m["al"] is not None:
        return "attn_out", int(m["al"]), None, False
    if m["rk"] is not None:
        return ("resid_pre" if m["rk"] == "resid" else m["rk"]), int(m["rl"]), None, False
    return m["g"], None, None, False


def parse_name(spec: Any, layer: int | None = None) -> Name:
    """The :class:`Name` a string (any form in the module doc), tuple or Name stands for.

    ``layer`` fills in the layer of a form that has none (``"z"`` + ``layer=3``); a form that
    has one must agree with it. Raises :class:`BadInputError` on anything else.
    """
    if isinstance(spec, Name):
        name = spec
    elif isinstance(spec, tuple):
        if not 1 <= len(spec) <= 3 or not isinstance(spec[0], str):
            raise BadInputError(f"unknown name {spec!r}: a tuple is get_act_name's arguments, "
                                "e.g. ('z', 3) or ('scale', 3, 'ln1').")
        full = act_name_tl(*spec)
        got = _from_hook(full)
        if got is None:
            raise BadInputError(f"{spec!r} gives {full!r}, which is not a hook name.")
        name = Name(got[0], got[1])
    elif isinstance(spec, str):
        name = _parse_str(spec.strip())
    else:
        raise BadInputError(f"a name must be a string, a tuple or a Name, got "
                            f"{type(spec).__name__}: e.g. 'blocks.3.attn.hook_z', 'z' or 'L3H5'.")
    if layer is not None:
        layer = int(layer)
        if name.is_global:
            raise BadInputError(f"{name} is not in a block: drop the layer.")
        if name.layer is not None and name.layer != layer:
            raise BadInputError(f"{spec!r} is in layer {name.layer}, but layer={layer} was "
                                "given: give the layer once.")
        name = replace(name, layer=layer)
    return name


def _parse_str(text: str) -> Name:
    m = _TAIL.match(text)
    assert m is not None
    base, pos, ch = m["base"], m["pos"], m["ch"]
    position = None if pos is None else int(pos)
    channel = None if ch is None else int(ch)
    via_head = False
    got = _short(base)
    if got is not None:
        kind, lay, unit, via_head = got
    else:
        hook = _from_hook(base)
        if hook is None and re.fullmatch(r"[a-z_]+(\d+[a-z0-9_]*)?", base):
            hook = _from_hook(act_name_tl(base))  # get_act_name's shorthand: z, k6, mlp_post
        if hook is None:
            raise BadInputError(
                f"unknown name {text!r}: write a TransformerLens hook name "
                "(blocks.3.attn.hook_z, hook_mlp_out), a get_act_name form (z, mlp_out, k6) or "
                "a short form (L3H5, L3H5.k, L3KV1.k, L3N1229, MLP3, ATTN3, resid3, embed), "
                "optionally followed by @POS.")
        (kind, lay), unit = hook, None
    if channel is not None:
        if unit_axis(kind) != "channel" or unit is not None:
            raise BadInputError(f"{text!r}: ':CHANNEL' only follows a d_model-wide name "
                                "(resid3@0:123, MLP3:7).")
        unit = channel
    return Name(kind, lay, unit, position, via_head)


def act_name_tl(name: str, layer: Any = None, layer_type: Any = None) -> str:
    """TransformerLens's ``get_act_name`` itself (found by :mod:`mechsink.model.bridge`)."""
    return _get_act_name()(name, layer, layer_type)


__all__ = ["KINDS", "UNIT_WORDS", "Kind", "Name", "axis_size",
           "explicit_bos", "kind_of_hook", "kv_head_of", "parse_name",
           "unit_axis", "unit_count"]
