"""One vocabulary for naming a place in the model: every accepted form parses to one :class:`Name`.

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
  ``.k`` / ``.v`` / ``.pattern`` (that head at another hook), ``L3N1229`` (neuron 1229 of
  ``mlp.hook_post``), ``MLP3`` (``hook_mlp_out``), ``ATTN3`` (``hook_attn_out``), ``resid3``
  (``hook_resid_pre``, the residual entering block 3; also ``resid_mid3``, ``resid_post3``),
  ``embed`` and ``pos_embed``.

Any form may end in ``@POS`` (one sequence position, negative counts from the end) and a
d_model-wide one in ``:CHANNEL`` (``resid3@0:123``). The canonical form is a :class:`Name`:
``kind`` (TransformerLens's short name), ``layer``, ``unit`` (a head, a neuron or a channel,
whichever the kind has) and ``position``; ``Name.hook`` is the TransformerLens hook name and
``str(name)`` the short form.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, replace
from typing import Any

from mechsink.errors import BadInputError
from mechsink.model import act_name, n_kv_heads
from mechsink.model import tl_get_act_name as _get_act_name


class MechsinkDeprecationWarning(DeprecationWarning):
    """An old spelling that still works for one release (its message names the new one)."""


# every deprecation message starts so (``-W "error:mechsink deprecation"`` finds callers)
DEPRECATED = "mechsink deprecation: "


def deprecated(old: str, new: str, stacklevel: int = 3) -> None:
    """Warn that ``old`` is now written ``new`` (kept for one release)."""
    warnings.warn(f"{DEPRECATED}{old} goes in the next release: write {new}.",
                  MechsinkDeprecationWarning, stacklevel=stacklevel)


def renamed_kwarg(kwargs: dict[str, Any], old: str, new: str, value: Any,
                  where: str) -> Any:
    """Take the old keyword ``old`` out of ``kwargs`` (with a warning) as ``new``'s value.

    Both given is an error; an unknown keyword left in ``kwargs`` is the caller's to reject.
    """
    if old not in kwargs:
        return value
    old_value = kwargs.pop(old)
    if value is not None:
        raise BadInputError(f"{where}: give {new}= only ({old}= is its old name).")
    deprecated(f"{where}({old}=...)", f"{where}({new}=...)", stacklevel=4)
    return old_value


def _is_text(x: Any) -> bool:
    return isinstance(x, str) or (isinstance(x, (list, tuple)) and bool(x)
                                  and all(isinstance(t, str) for t in x))


def explicit_bos(prepend_bos: bool | None, *inputs: Any, where: str) -> bool:
    """``prepend_bos`` as given; when it is not given and some input is text, True with a
    deprecation warning (the default goes next release: BOS is always a stated choice).

    Token tensors need no answer: they are used as they are.
    """
    if prepend_bos is not None:
        return bool(prepend_bos)
    if any(_is_text(x) for x in inputs):
        warnings.warn(f"{DEPRECATED}{where}: text input without prepend_bos= (it meant "
                      "prepend_bos=True): say prepend_bos=True or False.",
                      MechsinkDeprecationWarning, stacklevel=3)
    return True


# kind (TransformerLens short name) -> hook name relative to its block ("" prefix: global hook)
BLOCK_HOOKS: dict[str, str] = {
    "resid_pre": "hook_resid_pre",
    "resid_mid": "hook_resid_mid",
    "resid_post": "hook_resid_post",
    "attn_out": "hook_attn_out",
    "mlp_out": "hook_mlp_out",
    "q": "attn.hook_q",
    "k": "attn.hook_k",
    "v": "attn.hook_v",
    "z": "attn.hook_z",
    "rot_q": "attn.hook_rot_q",
    "rot_k": "attn.hook_rot_k",
    "result": "attn.hook_result",
    "pattern": "attn.hook_pattern",
    "attn_scores": "attn.hook_attn_scores",
    "pre": "mlp.hook_pre",
    "pre_linear": "mlp.hook_pre_linear",
    "post": "mlp.hook_post",
}
GLOBAL_HOOKS: dict[str, str] = {"embed": "hook_embed", "pos_embed": "hook_pos_embed",
                                "ln_final.hook_scale": "ln_final.hook_scale",
                                "ln_final.hook_normalized": "ln_final.hook_normalized"}
_RELATIVE = {v: k for k, v in BLOCK_HOOKS.items()}
_GLOBAL = {v: k for k, v in GLOBAL_HOOKS.items()}

HEAD_KINDS = ("q", "k", "v", "z", "rot_q", "rot_k", "result", "pattern", "attn_scores")
NEURON_KINDS = ("pre", "pre_linear", "post")
CHANNEL_KINDS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "embed",
                 "pos_embed")

_SHORT = re.compile(
    r"^(?:L(?P<hl>\d+)H(?P<h>\d+)(?:\.(?P<hk>q|k|v|z|pattern|attn_scores|result))?"
    r"|L(?P<nl>\d+)N(?P<n>\d+)"
    r"|MLP(?P<ml>\d+)|ATTN(?P<al>\d+)"
    r"|(?P<rk>resid|resid_pre|resid_mid|resid_post)(?P<rl>\d+)"
    r"|(?P<g>embed|pos_embed))$"
)
_TAIL = re.compile(r"^(?P<base>.*?)(?:@(?P<pos>-?\d+))?(?::(?P<ch>\d+))?$")
_FULL = re.compile(r"^blocks\.(?P<layer>\d+)\.(?P<rel>.+)$")


@dataclass(frozen=True)
class Name:
    """A place in the model: a hook ``kind`` at a ``layer``, optionally one ``unit`` of it (a
    head, neuron or channel, see :attr:`unit_word`) at one sequence ``position``.

    ``kind`` is TransformerLens's short name (``"z"``, ``"mlp_out"``, ``"post"``, ...) or, for a
    hook outside :data:`BLOCK_HOOKS`, its name relative to the block (``"ln1.hook_scale"``).
    ``layer`` None: a kind not tied to a layer yet (``"z"``), or a global hook (``embed``).
    """

    kind: str
    layer: int | None = None
    unit: int | None = None
    position: int | None = None

    @property
    def relative(self) -> str:
        """The hook name relative to the block (``"attn.hook_z"``), or the global hook name."""
        return GLOBAL_HOOKS.get(self.kind) or BLOCK_HOOKS.get(self.kind, self.kind)

    @property
    def is_global(self) -> bool:
        return self.kind in GLOBAL_HOOKS

    @property
    def hook(self) -> str:
        """The full TransformerLens hook name (``"blocks.3.attn.hook_z"``)."""
        if self.is_global:
            return GLOBAL_HOOKS[self.kind]
        if self.layer is None:
            raise BadInputError(f"{self.relative!r} lives in every block: give its layer "
                                f"(e.g. blocks.0.{self.relative} or layer=0).")
        return act_name(self.relative, self.layer)

    def hook_at(self, layer: int) -> str:
        """The full hook name of this kind at ``layer`` (a global hook ignores it)."""
        return self.hook if self.is_global else act_name(self.relative, layer)

    @property
    def unit_word(self) -> str | None:
        """What a unit of this kind is: ``"head"``, ``"neuron"``, ``"channel"`` or None."""
        if self.kind in HEAD_KINDS:
            return "head"
        if self.kind in NEURON_KINDS:
            return "neuron"
        if self.kind in CHANNEL_KINDS:
            return "channel"
        return None

    def with_(self, **changes: Any) -> Name:
        """A copy with fields changed (``layer``, ``unit``, ``position``)."""
        return replace(self, **changes)

    def __str__(self) -> str:
        """The short form where one exists (``L3H5@0``), else the hook name (+ ``@pos``)."""
        k, lay, u = self.kind, self.layer, self.unit
        tail = "" if self.position is None else f"@{self.position}"
        if lay is not None and u is not None and k in HEAD_KINDS and k in (
                "z", "q", "k", "v", "pattern", "attn_scores", "result"):
            return f"L{lay}H{u}" + ("" if k == "z" else f".{k}") + tail
        if lay is not None and u is not None and k == "post":
            return f"L{lay}N{u}{tail}"
        ch = "" if u is None or self.unit_word != "channel" else f":{u}"
        if k in GLOBAL_HOOKS and (u is None or ch):
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
        probe_layer = 0 if self.layer is None else self.layer
        if known is not None and self.hook_at(probe_layer) not in known:
            raise BadInputError(f"{self}: this model has no hook {self.hook_at(probe_layer)!r} "
                                "(see model.hook_dict for the names it has).")
        if self.unit is not None:
            size = unit_count(model, self.kind)
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


def unit_count(model: Any, kind: str) -> int:
    """How many units (heads, KV heads for k/v on GQA models, neurons, channels) ``kind`` has."""
    cfg = model.cfg
    if kind in ("k", "v", "rot_k"):
        return n_kv_heads(model)
    if kind in HEAD_KINDS:
        return int(cfg.n_heads)
    if kind in NEURON_KINDS:
        return int(cfg.d_mlp or 0)
    return int(cfg.d_model)


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


def _short(base: str) -> tuple[str, int | None, int | None] | None:
    """(kind, layer, unit) of the short form, None if ``base`` is not one."""
    m = _SHORT.match(base)
    if m is None:
        return None
    if m["hl"] is not None:
        return m["hk"] or "z", int(m["hl"]), int(m["h"])
    if m["nl"] is not None:
        return "post", int(m["nl"]), int(m["n"])
    if m["ml"] is not None:
        return "mlp_out", int(m["ml"]), None
    if m["al"] is not None:
        return "attn_out", int(m["al"]), None
    if m["rk"] is not None:
        return ("resid_pre" if m["rk"] == "resid" else m["rk"]), int(m["rl"]), None
    return m["g"], None, None


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
    got = _short(base)
    if got is not None:
        kind, lay, unit = got
    else:
        hook = _from_hook(base)
        if hook is None and re.fullmatch(r"[a-z_]+(\d+[a-z0-9_]*)?", base):
            hook = _from_hook(act_name_tl(base))  # get_act_name's shorthand: z, k6, mlp_post
        if hook is None:
            raise BadInputError(
                f"unknown name {text!r}: write a TransformerLens hook name "
                "(blocks.3.attn.hook_z, hook_mlp_out), a get_act_name form (z, mlp_out, k6) or "
                "a short form (L3H5, L3H5.k, L3N1229, MLP3, ATTN3, resid3, embed), optionally "
                "followed by @POS.")
        (kind, lay), unit = hook, None
    if channel is not None:
        if kind not in CHANNEL_KINDS or unit is not None:
            raise BadInputError(f"{text!r}: ':CHANNEL' only follows a d_model-wide name "
                                "(resid3@0:123, MLP3:7).")
        unit = channel
    return Name(kind, lay, unit, position)


def act_name_tl(name: str, layer: Any = None, layer_type: Any = None) -> str:
    """TransformerLens's ``get_act_name`` itself (found by :mod:`mechsink.model.bridge`)."""
    return _get_act_name()(name, layer, layer_type)


__all__ = ["BLOCK_HOOKS", "CHANNEL_KINDS", "GLOBAL_HOOKS", "HEAD_KINDS", "NEURON_KINDS",
           "MechsinkDeprecationWarning", "Name", "deprecated", "explicit_bos", "parse_name",
           "unit_count"]
