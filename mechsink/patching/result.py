"""PatchResult: a patching sweep's values with their labels, as a frame and a JSON.

Draw one with :func:`mechsink.viz.patching.heatmap` (viz reads patching, never the reverse).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mechsink.io import atomic_write_json
from mechsink.model import token_strings

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
            meta={"model": str(getattr(model.cfg, "model_name", "")),
                  "dtype": str(getattr(model.cfg, "dtype", "")).replace("torch.", ""), **meta},
        )

    @property
    def direction(self) -> str:
        """``"denoise"`` (corrupted run, clean patched in) or ``"noise"`` (the reverse)."""
        return str(self.meta.get("direction", "denoise"))

    @property
    def is_normalized(self) -> bool:
        return bool(self.meta.get("normalized"))

    def baselines(self) -> tuple[float | None, float | None]:
        """``(run input's metric, source input's metric)``: what 0 and 1 mean normalised."""
        if self.direction == "noise":
            return self.clean_value, self.corrupted_value
        return self.corrupted_value, self.clean_value

    def normalized(self) -> PatchResult:
        """The same sweep rescaled, without a re-run: 0 = the run input's metric, 1 = the
        source input's (denoise: 0 = corrupted, 1 = clean). Refuses when the two differ by
        float noise only (:func:`mechsink.patching.checks.check_normalizable`)."""
        from mechsink.patching.checks import check_normalizable

        if self.is_normalized:
            return self
        run, src = self.baselines()
        if run is None or src is None or self.clean_value is None:
            check_normalizable(0.0, None)
        assert run is not None and src is not None
        dtype = getattr(torch, str(self.meta.get("dtype") or "float32"), torch.float32)
        check_normalizable(src, run, dtype=dtype if isinstance(dtype, torch.dtype) else None)
        values = (self.values - run) / (src - run)
        return replace(self, values=values, meta={**self.meta, "normalized": True})

    def effects(self) -> Tensor:
        """Each patch's effect: value minus the run input's metric (0 when normalised)."""
        if self.is_normalized:
            return self.values
        run, _ = self.baselines()
        return self.values - (0.0 if run is None else run)

    def top(self, k: int = 5) -> list[dict[str, Any]]:
        """The ``k`` patches with the largest absolute effect, as labelled rows."""
        eff = self.effects().flatten()
        rows = []
        for i in eff.abs().argsort(descending=True)[:k].tolist():
            idx = [int(j) for j in torch.unravel_index(torch.tensor(i), self.values.shape)]
            row: dict[str, Any] = {a: self.labels[a][j] for a, j in zip(self.axes, idx,
                                                                         strict=True)}
            row["value"] = float(self.values.flatten()[i])
            row["effect"] = float(eff[i])
            rows.append(row)
        return rows

    def _shape_text(self) -> str:
        return " x ".join(f"{len(self.labels[a])} {a}" for a in self.axes)

    def __repr__(self) -> str:
        def fmt(v: float | None) -> str:
            return "None" if v is None else f"{v:.4g}"

        extra = f", ablation={self.meta['ablation']!r}" if self.meta.get("ablation") else ""
        return (f"PatchResult(site={self.site!r}, metric={self.metric!r}, "
                f"shape=[{self._shape_text()}], clean={fmt(self.clean_value)}, "
                f"corrupted={fmt(self.corrupted_value)}, direction={self.direction!r}"
                f"{extra}, normalized={self.is_normalized})")

    def _repr_html_(self) -> str:
        """A short card for Jupyter: what was patched, the baselines, the biggest effects."""
        from html import escape

        def fmt(v: Any) -> str:
            return f"{v:.4g}" if isinstance(v, float) else escape(str(v))

        top = self.top(5)
        head = "".join(f"<th>{escape(str(k))}</th>" for k in (top[0] if top else {}))
        body = "".join("<tr>" + "".join(f"<td>{fmt(v)}</td>" for v in r.values()) + "</tr>"
                       for r in top)
        what = "0 = run input, 1 = source" if self.is_normalized else "value - run input"
        return (f"<div><b>PatchResult</b> <code>{escape(self.site)}</code> &middot; metric "
                f"<code>{escape(self.metric)}</code> &middot; {escape(self._shape_text())}<br>"
                f"clean {fmt(self.clean_value)}, corrupted {fmt(self.corrupted_value)}, "
                f"{escape(self.direction)}"
                + (f", ablation {escape(str(self.meta['ablation']))}"
                   if self.meta.get("ablation") else "")
                + f"<br>largest effects ({what}):<table><tr>{head}</tr>{body}</table></div>")

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
            values=torch.tensor(_nan_for_null(d["values"]), dtype=torch.float64),
            axes=tuple(d["axes"]),
            labels=d["labels"], site=d["site"], metric=d["metric"],
            clean_value=d["clean_value"], corrupted_value=d["corrupted_value"],
            tokens=d["tokens"], meta=d["meta"],
        )


def _nan_for_null(values: Any) -> Any:
    """Nested lists with the ``null`` a non-finite value was written as read back as NaN (the
    file says why beside them: ``values_reason``)."""
    if isinstance(values, list):
        return [_nan_for_null(v) for v in values]
    return float("nan") if values is None else values
