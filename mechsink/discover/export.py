"""A discovered circuit as an edge list other circuit tools read, and back.

Two files, both one edge per entry:

- ``.json`` (schema ``mechsink-edge-list/1``): ``{"schema", "format", "graph", "how",
  "faithfulness", "edges": [{"edge", "src", "dest", "acdc", "score"}]}`` where ``edge`` is
  mechsink's name (``L0H1->L1H0.q``), ``src`` / ``dest`` are auto-circuit's node names (Miller
  et al. 2024, "Transformer Circuit Faithfulness Metrics are not Robust"; its edge is named
  ``f"{src}->{dest}"``): ``Resid Start``, ``A{layer}.{head}``, ``MLP {layer}`` as sources;
  ``A{layer}.{head}.Q`` / ``.K`` / ``.V``, ``MLP {layer}``, ``Resid End`` as destinations; and
  ``acdc`` is ACDC's edge key (Conmy et al. 2023, "Towards Automated Circuit Discovery"):
  ``[child hook, child head, parent hook, parent head]`` with TransformerLens hook names
  (``blocks.1.hook_q_input``, ``blocks.0.attn.hook_result``, ``blocks.0.hook_mlp_out``,
  ``blocks.0.hook_resid_pre``, ``blocks.1.hook_mlp_in``, the metric's
  ``blocks.L.hook_resid_post``) and ``null`` for a node without a head index.
- ``.tsv``: a header ``src	dest	score	edge`` and one line per edge (auto-circuit names first).

On a grouped-query model a key/value destination is a KV head: ``A3.KV1.K`` (ACDC's head index
is then the KV head). The metric receiver is ``Resid End`` when the metric reads the output of
a block (logit metrics: the last one); a metric reading a layer's attention input (a sink score)
is ``Resid Mid {layer}`` (ACDC: ``blocks.{layer}.hook_resid_pre``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from mechsink.discover.circuit import Circuit
from mechsink.discover.graph import Graph
from mechsink.errors import BadInputError
from mechsink.io import atomic_write_json, atomic_write_text
from mechsink.patching.nodes import Receiver, Sender

SCHEMA = "mechsink-edge-list/1"
FORMATS = (".json", ".tsv")


def source_name(s: Sender) -> str:
    """auto-circuit's name of a sender: ``Resid Start``, ``A{layer}.{head}``, ``MLP {layer}``."""
    if s.kind == "embed":
        return "Resid Start"
    if s.kind == "head":
        return f"A{s.layer}.{s.index}"
    if s.kind == "mlp":
        return f"MLP {s.layer}"
    raise BadInputError(f"sender {s.name!r} has no auto-circuit name (only the embedding, "
                        "heads and MLPs do).")


def dest_name(graph: Graph, r: Receiver) -> str:
    """auto-circuit's name of a receiver (see the module docstring)."""
    if r.kind == "metric":
        p = graph.point
        return "Resid End" if p.kind == "post" else f"Resid Mid {p.layer}"
    if r.kind in ("q", "k", "v"):
        head = f"KV{r.index}" if r.kind != "q" and r.grouped else str(r.index)
        return f"A{r.layer}.{head}.{r.kind.upper()}"
    if r.kind == "mlp":
        return f"MLP {r.layer}"
    raise BadInputError(f"receiver {r.name!r} has no auto-circuit name.")


def acdc_key(graph: Graph, s: Sender, r: Receiver) -> list[Any]:
    """ACDC's edge key: ``[child hook, child head, parent hook, parent head]``."""
    parent = {"embed": ("blocks.0.hook_resid_pre", None),
              "head": (f"blocks.{s.layer}.attn.hook_result", s.index),
              "mlp": (f"blocks.{s.layer}.hook_mlp_out", None)}[s.kind]
    if r.kind == "metric":
        p = graph.point
        child = (f"blocks.{p.layer}.hook_resid_post" if p.kind == "post"
                 else f"blocks.{p.layer}.hook_resid_pre", None)
    elif r.kind == "mlp":
        child = (f"blocks.{r.layer}.hook_mlp_in", None)
    else:
        child = (f"blocks.{r.layer}.hook_{r.kind}_input", r.index)
    return [child[0], child[1], parent[0], parent[1]]


def edge_rows(circuit: Circuit) -> list[dict[str, Any]]:
    """One entry per edge of ``circuit``: mechsink's, auto-circuit's and ACDC's names, score."""
    g = circuit.graph
    rows = []
    for e in circuit.edges:
        s, r = g.senders[int(g.src[e])], g.receivers[int(g.dst[e])]
        rows.append({"edge": g.edge_names[e], "src": source_name(s), "dest": dest_name(g, r),
                     "acdc": acdc_key(g, s, r),
                     "score": None if circuit.scores is None else float(circuit.scores[e])})
    return rows


def save_edge_list(circuit: Circuit, path: str | Path) -> Path:
    """Write ``circuit`` as ``.json`` or ``.tsv`` (chosen by the suffix; atomically)."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise BadInputError(f"edge list {path.name!r}: the name must end in .json or .tsv.")
    rows = edge_rows(circuit)
    if path.suffix == ".tsv":
        lines = ["src\tdest\tscore\tedge"] + [
            f"{r['src']}\t{r['dest']}\t{'' if r['score'] is None else repr(r['score'])}\t"
            f"{r['edge']}" for r in rows]
        return atomic_write_text(path, "\n".join(lines) + "\n")
    return atomic_write_json(path, {
        "schema": SCHEMA,
        "format": "one edge per entry: src/dest auto-circuit node names (edge = src->dest), "
                  "acdc = [child hook, child head, parent hook, parent head], edge = mechsink's",
        "graph": circuit.graph.to_dict(), "how": circuit.how,
        "faithfulness": circuit.faithfulness, "edges": rows})


def load_edge_list(path: str | Path, graph: Graph | None = None) -> Circuit:
    """A circuit from an edge list: ``.json`` from :func:`save_edge_list`, a discovery's
    ``circuit.json``, or a ``.tsv`` / ``.json`` naming edges by auto-circuit's ``src`` and
    ``dest`` only; scores of edges outside the list are 0. ``graph`` may be left out when the
    file carries its graph (mechsink's own JSON files do)."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise BadInputError(f"edge list {path.name!r}: the name must end in .json or .tsv.")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read edge list {path}: {exc}.") from exc
    if path.suffix == ".tsv":
        lines = [ln.split("\t") for ln in text.splitlines() if ln.strip()]
        if not lines or lines[0][:2] != ["src", "dest"]:
            raise BadInputError(f"{path}: the first line must be the header 'src<TAB>dest...'.")
        head = lines[0]
        rows = [dict(zip(head, ln, strict=False)) for ln in lines[1:]]
        meta: dict[str, Any] = {}
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInputError(f"{path} is not JSON ({exc}).") from exc
        if not isinstance(data, dict):
            raise BadInputError(f"{path}: expected a JSON object with an 'edges' list.")
        rows, meta = data.get("edges", []), data
    if graph is None:
        if "graph" not in meta:
            raise BadInputError(f"{path} does not carry its graph: pass the graph "
                                "(Graph.build(model, metric)).")
        graph = Graph.from_dict(meta["graph"])
    by_auto = {}
    for e in range(graph.n_edges):
        s, r = graph.senders[int(graph.src[e])], graph.receivers[int(graph.dst[e])]
        by_auto[(source_name(s), dest_name(graph, r))] = e
    edges: list[int] = []
    scores = torch.zeros(graph.n_edges, dtype=torch.float64)
    for i, row in enumerate(rows):
        e = _edge_of(graph, by_auto, row, f"{path} entry {i}")
        edges.append(e)
        score = row.get("score")
        if score not in (None, ""):
            scores[e] = float(score)
    return Circuit(graph, edges, str(meta.get("how", f"loaded from {path.name}")),
                   meta.get("faithfulness"), scores, {"source": str(path)})


def _edge_of(graph: Graph, by_auto: dict[tuple[str, str], int], row: dict[str, Any],
             where: str) -> int:
    """The edge a row names: by auto-circuit's ``src`` / ``dest`` or, without them, by
    mechsink's own ``edge`` name (a discovery's ``circuit.json``)."""
    if not isinstance(row, dict):
        raise BadInputError(f"{where}: expected an object naming an edge, got {row!r}.")
    if row.get("src") is None and row.get("dest") is None and row.get("edge") is not None:
        try:
            return graph.edge_index(str(row["edge"]))
        except BadInputError as exc:
            raise BadInputError(f"{where}: {exc}") from None
    key = (row.get("src"), row.get("dest"))
    if key not in by_auto:
        raise BadInputError(f"{where}: no edge {key[0]}->{key[1]} in this graph "
                            f"(e.g. {'->'.join(next(iter(by_auto)))}).")
    return by_auto[key]
