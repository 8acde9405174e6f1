"""The weight-only int4 figure: the change in loss from full precision per setting, one group of
bars per model, with the 95% intervals over prompts (read from each model's
``weight_quantization`` JSON)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from mechsink.viz.style import PAGE_WIDTH, PALETTE, save, use_style

LABELS = {
    "int4_group": "int4 g128",
    "int4_group_super_kept": "int4 g128, super kept",
    "int4_channel": "int4 per channel",
    "int4_channel_super_kept": "int4 per channel, super kept",
    "super_zeroed": "super weights zeroed",
    "top_super_zeroed": "top super weight zeroed",
    "super_kept_alone": "super kept alone",
}


@use_style
def weight_quantization_figure(results: Mapping[str, Mapping[str, Any]], path: Path) -> Path:
    """Change in next-token loss from full precision (log scale) per setting and model; the
    whiskers are the intervals over prompts."""
    settings = [k for k in LABELS if any(k in d["settings"] for d in results.values())]
    fig, ax = plt.subplots(figsize=(min(PAGE_WIDTH, 7.0), 3.8), layout="constrained")
    width = 0.8 / max(1, len(settings))
    for j, key in enumerate(settings):
        xs, ys, lo, hi = [], [], [], []
        for i, d in enumerate(results.values()):
            row = d["settings"].get(key)
            if row is None:
                continue
            iv = row.get("delta_interval") or {}
            y = row["delta_loss"]
            xs.append(i + (j - (len(settings) - 1) / 2) * width)
            ys.append(y)
            lo.append(max(0.0, y - iv.get("low", y)))
            hi.append(max(0.0, iv.get("high", y) - y))
        ax.bar(xs, ys, width, yerr=[lo, hi], color=PALETTE[j % len(PALETTE)],
               label=LABELS[key], capsize=2)
    ax.set_xticks(range(len(results)), [f"{m}" for m in results])
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_ylabel("loss change from full precision (nats)")
    ax.set_title("Weight-only int4 and the super weights")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=3, frameon=False)
    return save(fig, path)
