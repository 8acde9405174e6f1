"""The computational graph edge-level circuit discovery works on.

Nodes are the input embedding, every attention head and every MLP (the *senders*: each
writes into the residual stream; on request, chosen MLP neurons are senders of their own,
``L11N1229``, writing their activation times their row of ``W_out``, and ``MLP11`` is then
the rest of that MLP's write, bias included), and the *receivers* that read the residual
stream: each head's query input, each key/value head's key and value inputs (per KV head on
grouped-query models, as the model computes them), each MLP's input and the metric. An edge
joins a sender to a receiver that reads the residual stream after the sender wrote to it
(Conmy et al. 2023, "Towards Automated Circuit Discovery"; Syed et al. 2023, "Attribution
Patching Outperforms Automated Circuit Discovery"): head ``L3H1 -> L5H2.q`` means "head
3.1's output, as head 5.2's query reads it".

The graph stops where the metric reads the model (:func:`metric_point`): a metric on the
attention pattern of layer ``L`` reads the residual entering that layer's attention (so the
heads of layer ``L`` and everything after are not nodes), a metric on ``resid_post`` of layer
``L`` reads the residual after block ``L``, a logit metric reads the last block's output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.model import n_kv_heads, true_d_mlp
from mechsink.names import Name, kind_of_hook
from mechsink.patching.metrics import Metric, layer_of
from mechsink.patching.nodes import RECEIVERS, Receiver, Sender

#: where a receiver reads: ``(hook, head)``, ``head`` the index into a per-head input's head
#: axis, or None (no head axis, or every head at once)
Site = tuple[str, int | None]


@dataclass(frozen=True)
class MetricPoint:
    """Where the metric reads the residual stream: ``"attn"`` (the input of layer ``layer``'s
    attention) or ``"post"`` (the output of block ``layer``)."""

    kind: str
    layer: int

    @property
    def stage(self) -> int:
        return 2 * self.layer + (1 if self.kind == "attn" else 3)

    @property
    def sites(self) -> list[Site]:
        """Where the metric receiver's input is changed: every head's query, key and value
        input of the layer (attn), or the block's output (post)."""
        if self.kind == "attn":
            return [(Name(RECEIVERS[k][0], self.layer).hook, None) for k in ("q", "k", "v")]
        return [(Name("resid_post", self.layer).hook, None)]

    def __str__(self) -> str:
        return (f"attention input of layer {self.layer}" if self.kind == "attn"
                else f"output of block {self.layer}")


def metric_point(model: Any, metric: Metric) -> MetricPoint:
    """Where ``metric`` reads the model: the latest residual its hooks (or logits) depend on."""
    needs = metric.needs(model)
    n_layers = int(model.cfg.n_layers)
    if needs.logits is not None:
        return MetricPoint("post", n_layers - 1)
    points = []
    for hook in needs.hooks:
        layer, kind = layer_of(hook), kind_of_hook(hook)
        name = None if kind is None else kind.name
        in_attn = (kind is not None and kind.part == "attn") or ".attn." in hook
        if layer is not None and name == "resid_post":
            points.append(MetricPoint("post", layer))
        elif layer is not None and name == "resid_pre" and layer > 0:
            points.append(MetricPoint("post", layer - 1))
        elif layer is not None and in_attn:
            points.append(MetricPoint("attn", layer))
        else:
            raise BadInputError(
                f"edge discovery cannot place the metric's hook {hook!r} in the graph: use a "
                "metric on logits, attention patterns/queries/keys of a layer, or "
                "resid_post (SinkScore, MassiveValue, ResidNorm, LogitDiff, KLToClean).")
    if not points:
        raise BadInputError("the metric reads nothing: give a metric on logits or activations.")
    point = max(points, key=lambda p: p.stage)
    if point.stage <= 1:
        raise BadInputError("the metric reads the model before any component writes (layer 0's "
                            "attention input): there are no edges to score.")
    return point


@dataclass
class Graph:
    """Senders, receivers and the edges between them for one model and one metric point.

    Edges are numbered: edge ``e`` joins ``senders[src[e]]`` to ``receivers[dst[e]]``.
    Scores and masks over edges are 1-D tensors in this order.
    """

    n_layers: int  # blocks with nodes (those before the metric point)
    n_heads: int
    n_kv: int
    point: MetricPoint
    senders: list[Sender] = field(default_factory=list)
    receivers: list[Receiver] = field(default_factory=list)
    #: layer -> the MLP neurons that are senders of their own (ascending)
    neurons: dict[int, list[int]] = field(default_factory=dict)

    @classmethod
    def build(cls, model: Any, metric: Metric | MetricPoint,
              neurons: Mapping[int, Sequence[int]] | None = None) -> Graph:
        """The full graph of ``model`` up to where ``metric`` reads it; ``neurons`` (layer ->
        neuron indices) become senders of their own, right after their MLP (same stage)."""
        point = metric if isinstance(metric, MetricPoint) else metric_point(model, metric)
        return cls._assemble(int(model.cfg.n_layers), int(model.cfg.n_heads), n_kv_heads(model),
                             point, check_neurons(model, point, neurons))

    @classmethod
    def _assemble(cls, n_layers: int, n_heads: int, n_kv: int, point: MetricPoint,
                  neurons: dict[int, list[int]]) -> Graph:
        """The graph of a model of ``n_layers`` blocks, from its shape alone."""
        g = cls(0, n_heads, n_kv, point, neurons=neurons)
        g.senders.append(Sender("embed"))
        gqa = n_kv != n_heads  # key/value receivers are then named by KV head (L3KV1.k)
        for layer in range(n_layers):
            if 2 * layer + 1 >= point.stage:
                break
            g.n_layers = layer + 1
            g.senders += [Sender("head", layer, h) for h in range(n_heads)]
            g.receivers += [Receiver("q", layer, h) for h in range(n_heads)]
            g.receivers += [Receiver(k, layer, h, grouped=gqa) for k in ("k", "v")
                            for h in range(n_kv)]
            if 2 * layer + 2 < point.stage:
                g.senders.append(Sender("mlp", layer))
                g.senders += [Sender("neuron", layer, n) for n in g.neurons.get(layer, ())]
                g.receivers.append(Receiver("mlp", layer))
        g.receivers.append(Receiver("metric"))
        return g

    def receiver_stage(self, r: Receiver) -> int:
        """When ``r`` reads (the metric: at the metric point)."""
        return self.point.stage if r.kind == "metric" else r.stage

    def receiver_layer(self, r: Receiver) -> int:
        """The block ``r`` reads in (the metric: the metric point's)."""
        return self.point.layer if r.layer is None else r.layer

    def sites(self, r: Receiver) -> list[Site]:
        """Where ``r`` reads its own copy of the residual stream in graph mode: a per-head
        input with its head (query head for q, KV head for k/v), the MLP's input, or the
        metric point's hooks."""
        if r.kind == "metric":
            return self.point.sites
        return [(r.read_hook, r.index if r.kind in ("q", "k", "v") else None)]

    def n_senders_before(self, r: Receiver) -> int:
        """How many senders (a prefix of :attr:`senders`) write before ``r`` reads."""
        stage = self.receiver_stage(r)
        return sum(1 for s in self.senders if s.stage < stage)

    @cached_property
    def valid(self) -> Bool[Tensor, "sender receiver"]:
        """``valid[s, r]``: sender ``s`` writes before receiver ``r`` reads."""
        s = torch.tensor([x.stage for x in self.senders])
        r = torch.tensor([self.receiver_stage(x) for x in self.receivers])
        return s[:, None] < r[None, :]

    @cached_property
    def src(self) -> Int[Tensor, " edge"]:
        return self.valid.nonzero()[:, 0]

    @cached_property
    def dst(self) -> Int[Tensor, " edge"]:
        return self.valid.nonzero()[:, 1]

    @property
    def n_edges(self) -> int:
        return int(self.src.numel())

    def edge_name(self, e: int) -> str:
        return f"{self.senders[int(self.src[e])].name}->{self.receivers[int(self.dst[e])].name}"

    @cached_property
    def edge_names(self) -> list[str]:
        return [self.edge_name(e) for e in range(self.n_edges)]

    def edge_index(self, name: str) -> int:
        """The number of the edge called ``name`` (``"L0H1->L2H0.q"``)."""
        try:
            return self._index[name]
        except KeyError:
            raise BadInputError(f"no edge {name!r} in this graph (it has {self.n_edges} edges, "
                                f"e.g. {self.edge_names[0]!r}).") from None

    @cached_property
    def _index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.edge_names)}

    def dense(self, values: Tensor) -> Tensor:
        """Edge values ``[..., edge]`` as a ``[..., sender, receiver]`` matrix (0 off-graph)."""
        out = values.new_zeros(*values.shape[:-1], len(self.senders), len(self.receivers))
        out[..., self.src, self.dst] = values
        return out

    def path_spec(self, e: int) -> tuple[str, str]:
        """The edge as :func:`mechsink.patching.path.path_patch` names it (sender, receiver):
        both speak :mod:`mechsink.patching.nodes`'s names."""
        return self.senders[int(self.src[e])].name, self.receivers[int(self.dst[e])].name

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Graph:
        """The graph :meth:`to_dict` wrote, rebuilt without the model (a saved discovery's or
        circuit's ``graph``); refused when its senders and receivers are not the ones such a
        graph has (a hand-edited or foreign file)."""
        try:
            point = MetricPoint(str(data["metric_point"]["kind"]),
                                int(data["metric_point"]["layer"]))
            shape = [int(data[k]) for k in ("n_layers", "n_heads", "n_kv_heads")]
            neurons = {int(k): [int(n) for n in v]
                       for k, v in dict(data.get("neurons") or {}).items()}
            senders, receivers = list(data["senders"]), list(data["receivers"])
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInputError(f"not a mechsink graph (n_layers, n_heads, n_kv_heads, "
                                f"metric_point, senders, receivers): {exc!r}.") from None
        if point.kind not in ("attn", "post"):
            raise BadInputError(f"not a mechsink graph: metric point {point.kind!r} is neither "
                                "'attn' nor 'post'.")
        g = cls._assemble(shape[0], shape[1], shape[2], point, neurons)
        if g.n_layers != shape[0] or [s.name for s in g.senders] != senders or [
                r.name for r in g.receivers] != receivers:
            raise BadInputError("not a mechsink graph: its senders and receivers are not those "
                                f"of a {shape[0]}-layer graph read at the {point}.")
        return g

    def to_dict(self) -> dict[str, Any]:
        return {"n_layers": self.n_layers, "n_heads": self.n_heads, "n_kv_heads": self.n_kv,
                "metric_point": {"kind": self.point.kind, "layer": self.point.layer},
                "senders": [s.name for s in self.senders],
                "receivers": [r.name for r in self.receivers], "n_edges": self.n_edges,
                **({"neurons": {str(k): v for k, v in self.neurons.items()}}
                   if self.neurons else {})}


def check_neurons(model: Any, point: MetricPoint,
                  neurons: Mapping[int, Sequence[int]] | None) -> dict[int, list[int]]:
    """``neurons`` checked against the model and the graph (each layer's MLP must write
    before the metric reads; indices in 0..d_mlp-1, no repeats), as sorted lists."""
    if not neurons:
        return {}
    if not isinstance(neurons, Mapping):
        raise BadInputError(f"neurons must map a layer to neuron indices, e.g. {{11: [1229, "
                            f"1487]}}, got {neurons!r}.")
    d_mlp = int(true_d_mlp(model) or model.cfg.d_mlp)
    out: dict[int, list[int]] = {}
    for layer, idx in neurons.items():
        if isinstance(layer, bool) or not isinstance(layer, int) or not (
                0 <= layer < int(model.cfg.n_layers)):
            raise BadInputError(f"neuron layer {layer!r} is not a layer of this model "
                                f"(0..{int(model.cfg.n_layers) - 1}).")
        if 2 * layer + 2 >= point.stage:
            raise BadInputError(f"MLP {layer} writes after the metric reads ({point}): its "
                                "neurons are not in the graph; choose an earlier layer.")
        items = list(idx)
        bad = [n for n in items if isinstance(n, bool) or not isinstance(n, int)
               or not 0 <= n < d_mlp]
        if bad or not items:
            raise BadInputError(f"neurons of layer {layer} must be indices in 0..{d_mlp - 1}, "
                                f"got {items!r}.")
        if len(set(items)) != len(items):
            raise BadInputError(f"neurons of layer {layer} repeat an index: {items!r}.")
        out[layer] = sorted(items)
    return dict(sorted(out.items()))


def parse_neurons(spec: str | Sequence[str] | None) -> dict[int, list[int]] | str:
    """``"L11:1229,1487"`` (several layers separated by ``;`` or given as a list) as
    ``{11: [1229, 1487]}``, or ``"super"`` (the census's complete super-neuron sets); the
    CLI's ``--neurons``."""
    if spec is None:
        return {}
    parts = [spec] if isinstance(spec, str) else list(spec)
    if [p.strip() for p in parts] == ["super"]:
        return "super"
    out: dict[int, list[int]] = {}
    for part in (p.strip() for x in parts for p in x.split(";")):
        if not part:
            continue
        head, sep, tail = part.partition(":")
        try:
            if not sep or not head.upper().startswith("L"):
                raise ValueError
            layer = int(head[1:])
            idx = [int(t) for t in tail.split(",") if t.strip()]
        except ValueError:
            raise BadInputError(f"cannot read neurons {part!r}: write L<layer>:<n>,<n> "
                                "(e.g. L11:1229,1487; several layers separated by ';').") from None
        if not idx or layer in out:
            raise BadInputError(f"neurons {part!r}: give at least one neuron, each layer once.")
        out[layer] = idx
    return out
