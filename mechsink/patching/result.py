"""PatchResult: a patching sweep's values with their labels, as a frame and a JSON.

Draw one with :func:`mechsink.viz.patching.heatmap` (viz reads patching, never the reverse).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mechsink.bridge import token_strings
from mechsink.io import atomic_write_json

SCHEMA = "mechsink-patch/1"


@dataclass
class PatchResult:
    """Values of a sweep (one axis per entry of ``axes``) plus everything needed to read them.

    ``labels[axis]`` lists the index values along each axis (layer numbers, head numbers,
    positions, neurons); ``tokens`` are the clean prompt's token strings, for position axes.
    """

    values: Tensor
    axes: tuple[str, ...]
    labels: dict[str, list[Any]]
    site: str
    metric: str
    clean_value: float | None = None
    corrupted_value: float | None = None
    tokens: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_site(
        cls, model: Any, site: Any, values: Tensor, *, metric_name: str, clean_value: float,
        corrupted_value: float, tokens: Tensor, **meta: Any,
    ) -> PatchResult:
        """Label ``values`` with a resolved site's axes and the clean prompt's tokens."""
        return cls(
            values=values, axes=tuple(site.axes),
            labels={a: list(v) for a, v in site.axis_values().items()},
            site=site.label, metric=metric_name, clean_value=clean_value,
            corrupted_value=corrupted_value, tokens=token_strings(model, tokens),
            meta={"model": str(getattr(model.cfg, "model_name", "")), **meta},
        )

    def to_frame(self) -> Any:
        """A long pandas DataFrame: one row per patch, a column per axis, then ``value``."""
        import pandas as pd

        grids = torch.meshgrid(*[torch.arange(len(self.labels[a])) for a in self.axes],
                               indexing="ij")
        data: dict[str, Any] = {}
        for a, g in zip(self.axes, grids, strict=True):
            data[a] = [self.labels[a][i] for i in g.flatten().tolist()]
            if a in ("pos", "dest_pos", "src_pos") and self.tokens:
                data[f"{a}_token"] = [self.tokens[p] for p in data[a]]
        data["value"] = self.values.flatten().tolist()
        return pd.DataFrame(data)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able content (values as nested lists)."""
        return {
            "schema": SCHEMA, "site": self.site, "metric": self.metric, "axes": list(self.axes),
            "labels": self.labels, "values": self.values.tolist(), "tokens": self.tokens,
            "clean_value": self.clean_value, "corrupted_value": self.corrupted_value,
            "meta": self.meta,
        }

    def to_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` to ``path`` atomically (temporary file, then rename)."""
        return atomic_write_json(path, self.to_dict())

    @classmethod
    def from_json(cls, path: str | Path) -> PatchResult:
        """Read a result written by :meth:`to_json` (checks the schema)."""
        d = json.loads(Path(path).read_text(encoding="utf-8"))
        if d.get("schema") != SCHEMA:
            raise ValueError(f"{path} is not a {SCHEMA} file (schema {d.get('schema')!r}).")
        return cls(
            values=torch.tensor(d["values"], dtype=torch.float64), axes=tuple(d["axes"]),
            labels=d["labels"], site=d["site"], metric=d["metric"],
            clean_value=d["clean_value"], corrupted_value=d["corrupted_value"],
            tokens=d["tokens"], meta=d["meta"],
        )
