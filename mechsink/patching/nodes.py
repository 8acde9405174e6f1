"""Senders and receivers: the components path patching and edge discovery join by edges.

A :class:`Sender` writes into the residual stream (the input embedding, a head, an MLP, one
neuron of an MLP); a :class:`Receiver` reads it (a head's query, key or value input, an MLP's
input, the residual entering a block, or the metric). Both are named in
:mod:`mechsink.names`'s vocabulary and sit at hooks of its one table of kinds
(:data:`mechsink.names.KINDS`): :data:`SENDERS` and :data:`RECEIVERS` say which kind each node
is, for the two ways mechsink reaches it. Path patching sets what a sender *computes* and
records and replaces what a receiver computes from its input; edge discovery reads what each
sender *writes* (each head's own ``hook_result``) and injects into each receiver's own copy of
the residual stream (``hook_q_input``, ``hook_mlp_in``, ... in :func:`~mechsink.discover.graph_run.
graph_mode`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mechsink.errors import BadInputError
from mechsink.names import Name, kv_head_of, parse_name

#: sender kind -> (the :data:`~mechsink.names.KINDS` kind holding what it computes, the kind
#: holding what it adds to the residual stream)
SENDERS: dict[str, tuple[str, str]] = {
    "embed": ("resid_pre", "resid_pre"),  # the residual entering block 0
    "head": ("z", "result"),
    "mlp": ("mlp_out", "mlp_out"),
    "neuron": ("post", "mlp_out"),
}
#: receiver kind -> (the kind where it reads its own copy of the residual stream in graph
#: mode, the kind holding what it computes from that read)
RECEIVERS: dict[str, tuple[str, str]] = {
    "q": ("q_input", "q"),
    "k": ("k_input", "k"),
    "v": ("v_input", "v"),
    "mlp": ("mlp_in", "mlp_out"),
    "resid": ("resid_pre", "resid_pre"),
}


def _hook(kind: str, layer: int) -> str:
    return Name(kind, layer).hook


@dataclass(frozen=True)
class Sender:
    """A component that writes into the residual stream: ``kind`` in embed/head/mlp/neuron,
    its ``layer`` (None for ``embed``), ``index`` (the head or neuron; None otherwise) and
    optionally one ``position``."""

    kind: str
    layer: int | None = None
    index: int | None = None
    position: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in SENDERS:
            raise BadInputError(f"unknown sender kind {self.kind!r}: one of {', '.join(SENDERS)}.")

    @property
    def block(self) -> int:
        """The first block this sender changes (0 for the embedding)."""
        return 0 if self.layer is None else self.layer

    @property
    def name(self) -> str:
        """``embed``, ``L3H5``, ``MLP3`` or ``L3N7``, with ``@POS`` when it has a position."""
        base = {"embed": "embed", "head": f"L{self.layer}H{self.index}",
                "mlp": f"MLP{self.layer}", "neuron": f"L{self.layer}N{self.index}"}[self.kind]
        return base if self.position is None else f"{base}@{self.position}"

    @property
    def stage(self) -> int:
        """When it writes: embed 0, heads of layer L at 2L+1, MLP L (and its neurons) at 2L+2."""
        if self.kind == "embed":
            return 0
        return 2 * self.block + (1 if self.kind == "head" else 2)

    @property
    def hook(self) -> str:
        """The hook holding what it computes (``hook_z`` for a head: path patching sets it)."""
        return _hook(SENDERS[self.kind][0], self.block)

    @property
    def write_hook(self) -> str:
        """The hook holding what it adds to the residual stream (a head's ``hook_result``)."""
        return _hook(SENDERS[self.kind][1], self.block)

    def check(self, model: Any, seq_len: int | None = None) -> None:
        """Raise :class:`BadInputError` unless the model (and prompt) has this component."""
        Name(SENDERS[self.kind][0], self.block, self.index, self.position).check(model, seq_len)


@dataclass(frozen=True)
class Receiver:
    """A component that reads the residual stream: ``kind`` in q/k/v/mlp/resid/metric, its
    ``layer`` (None for ``metric``), ``index`` and optionally one ``position``.

    ``index``: for ``q`` a head, for ``k``/``v`` a KV head (None: every head); for ``resid`` a
    channel (None: all of them). ``via_head``: a k/v index that is the query head it was named
    by (``L3H5.k``: the KV head head 5 reads, see :meth:`index_on`). ``grouped``: k/v named by
    KV head (``L3KV1.k``; discovery names the receivers of grouped-query models so).
    """

    kind: str
    layer: int | None = None
    index: int | None = None
    position: int | None = None
    via_head: bool = False
    grouped: bool = False

    def __post_init__(self) -> None:
        if self.kind not in (*RECEIVERS, "metric"):
            raise BadInputError(f"unknown receiver kind {self.kind!r}: one of "
                                f"{', '.join(RECEIVERS)}, metric.")

    @property
    def name(self) -> str:
        """``metric``, ``L3H5.q``, ``L3H5.k`` / ``L3KV1.k``, ``MLP3`` or ``resid3`` (a hook name
        for every head of a block), with ``@POS`` (and ``:CHANNEL``) when given."""
        k, lay, i = self.kind, self.layer, self.index
        tail = "" if self.position is None else f"@{self.position}"
        if k == "metric":
            return "metric"
        if k in ("q", "k", "v"):
            if i is None:
                return self.hook + tail
            if k != "q" and self.grouped and not self.via_head:
                return f"L{lay}KV{i}.{k}{tail}"
            return f"L{lay}H{i}.{k}{tail}"
        if k == "mlp":
            return f"MLP{lay}{tail}"
        return f"resid{lay}{tail}" + ("" if i is None else f":{i}")

    @property
    def stage(self) -> int:
        """When it reads: attention of layer L (and the residual entering L) at 2L+1, MLP L at
        2L+2 (the metric's stage is where the metric reads: see the discovery graph)."""
        if self.layer is None:
            raise BadInputError("the metric receiver reads where the metric does: ask the graph.")
        return 2 * self.layer + (2 if self.kind == "mlp" else 1)

    @property
    def read_hook(self) -> str:
        """Where it reads its own copy of the residual stream in graph mode (``hook_q_input``
        ``[batch, pos, head, d_model]``, ``hook_mlp_in``, ``hook_resid_pre``)."""
        return _hook(RECEIVERS[self.kind][0], self._layer())

    @property
    def hook(self) -> str:
        """The hook holding what it computes from its read (``attn.hook_q``, ``hook_mlp_out``,
        ``hook_resid_pre``): path patching records and replaces it there."""
        return _hook(RECEIVERS[self.kind][1], self._layer())

    def _layer(self) -> int:
        if self.layer is None:
            raise BadInputError("the metric receiver has no hook of its own.")
        return self.layer

    def index_on(self, model: Any) -> int | None:
        """The index on the kind's own axis (a KV head for k/v named by a query head)."""
        if self.index is None or not self.via_head:
            return self.index
        return kv_head_of(model, self.index)

    def check(self, model: Any, seq_len: int | None = None) -> None:
        """Raise :class:`BadInputError` unless the model (and prompt) has this component."""
        if self.kind == "metric":
            return
        Name(RECEIVERS[self.kind][1], self._layer(), self.index, self.position,
             self.via_head).check(model, seq_len)


def sender_group(spec: str | Name | Sender, n_heads: int | None = None) -> list[Sender]:
    """The senders one name stands for: one, or every head of a block (``ATTN3``,
    ``blocks.3.attn.hook_z``; needs ``n_heads``)."""
    if isinstance(spec, Sender):
        return [spec]
    try:
        name = parse_name(spec)
    except BadInputError as exc:
        raise BadInputError(f"unknown sender {spec!r}: write embed, L<layer>H<head>, "
                            "ATTN<layer>, MLP<layer> or L<layer>N<neuron> (or a hook name, "
                            "blocks.3.attn.hook_z), optionally followed by @<pos>.") from exc
    pos, layer = name.position, name.layer
    if name.kind == "embed" or (name.kind == "resid_pre" and layer == 0 and name.unit is None):
        return [Sender("embed", position=pos)]
    if layer is not None and name.unit is None and name.kind in ("z", "attn_out"):
        if n_heads is None:
            raise BadInputError(f"{spec!r} is every head of block {layer}: pass it to "
                                "path_patch, or name one head (L3H5).")
        return [Sender("head", layer, h, pos) for h in range(n_heads)]
    if layer is not None and name.kind == "z":
        return [Sender("head", layer, name.unit, pos)]
    if layer is not None and name.kind in ("mlp_out", "post") and name.unit is None:
        return [Sender("mlp", layer, None, pos)]  # every neuron of the block: the MLP's output
    if layer is not None and name.kind == "post":
        return [Sender("neuron", layer, name.unit, pos)]
    raise BadInputError(
        f"{spec!r} ({name}) is not a sender: write embed, L<layer>H<head>, ATTN<layer>, "
        "MLP<layer> or L<layer>N<neuron> (or their hook names, blocks.3.attn.hook_z, "
        "blocks.3.hook_mlp_out), optionally followed by @<pos>.")


def parse_component(spec: str | Name | Sender) -> Sender:
    """A :class:`Sender` from one sender name: ``embed``, ``L12H3``, ``MLP7``, ``L4N301``
    (+ ``@pos``), or a hook name such as ``blocks.7.hook_mlp_out``."""
    return sender_group(spec)[0]  # a name of several senders needs n_heads: refused above


def parse_receiver(spec: str | Name | Receiver) -> Receiver:
    """A :class:`Receiver` from ``metric``, ``L12H3.q``, ``L12H3.k`` (the key head 3 reads),
    ``L12KV1.k``, ``MLP7``, ``resid9@0:123`` or a hook name (``blocks.12.attn.hook_k``: every
    head's key; ``blocks.9.hook_resid_pre``)."""
    if isinstance(spec, Receiver):
        return spec
    if isinstance(spec, str) and spec.strip() == "metric":
        return Receiver("metric")
    try:
        name = parse_name(spec)
    except BadInputError as exc:
        raise BadInputError(f"unknown receiver {spec!r}: write metric, L<layer>H<head>.q|k|v, "
                            "L<layer>KV<head>.k|v, MLP<layer> or resid<layer>[@pos[:channel]] "
                            "(or a hook name, blocks.3.attn.hook_k).") from exc
    if name.layer is not None:
        if name.kind in ("q", "k", "v"):
            grouped = name.kind != "q" and name.unit is not None and not name.via_head
            return Receiver(name.kind, name.layer, name.unit, name.position, name.via_head,
                            grouped)
        if name.kind == "mlp_out" and name.unit is None:
            return Receiver("mlp", name.layer, None, name.position)
        if name.kind == "resid_pre":
            return Receiver("resid", name.layer, name.unit, name.position)
    raise BadInputError(
        f"{spec!r} ({name}) is not a receiver: write metric, L<layer>H<head>.q|k|v, MLP<layer> "
        "or resid<layer>[@pos[:channel]] (or their hook names, blocks.3.attn.hook_k, "
        "blocks.3.hook_resid_pre).")


__all__ = ["RECEIVERS", "SENDERS", "Receiver", "Sender", "parse_component", "parse_receiver",
           "sender_group"]
