"""The figure of a sweep's merged census (``mechsink sweep``): sink rate per model and input."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from mechsink.io import atomic_write_bytes


def sink_rate_figure(rows: list[dict[str, Any]], path: Path) -> Path:
    """Sink rate per model, one bar per input run (as Gu et al. 2024, "When Attention Sink
    Emerges in Language Models", draw it); a PNG without timestamps, so equal data give equal
    bytes."""
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(r["model"] for r in rows))
    runs = list(dict.fromkeys(r["run"] for r in rows))
    value = {(r["model"], r["run"]): r["sink_rate"] for r in rows}
    fig = Figure(figsize=(max(4.0, 0.9 * len(models) + 2), 3.6))
    ax = fig.add_subplot()
    width = 0.8 / len(runs)
    for j, run in enumerate(runs):
        xs = [i + (j - (len(runs) - 1) / 2) * width for i in range(len(models))]
        ax.bar(xs, [100 * value.get((m, run), 0.0) for m in models], width, label=run)
    ax.set_xticks(range(len(models)), models, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("sink rate (% of heads, key 0)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None})
    return atomic_write_bytes(path, buf.getvalue())
