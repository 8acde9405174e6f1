"""The streaming-perplexity figure: perplexity against the window, one line per number of kept
first tokens, clean and with the sink circuit removed (read from ``streaming.json``)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt

from mechsink.viz.style import PAGE_WIDTH, PALETTE, save, use_style


@use_style
def streaming_figure(data: Mapping[str, Any], path: Path) -> Path:
    """Perplexity against the window W for each kept-token count s (solid: clean model;
    dashed: super-neuron sets zeroed at position 0), with the dense baselines."""
    fig, ax = plt.subplots(figsize=(min(PAGE_WIDTH, 6.0), 3.8), layout="constrained")
    windows = data["windows"]
    edited = data.get("circuit_removed") or {}
    for i, s in enumerate(data["sinks"]):
        color = PALETTE[i % len(PALETTE)]
        ax.plot(windows, [data["perplexity"][str(s)][str(w)] for w in windows], marker="o",
                color=color, label=f"s = {s} kept")
        if "table" in edited:
            ax.plot(windows, [edited["table"][str(s)][str(w)] for w in windows], marker="s",
                    ls="--", color=color, label=f"s = {s}, circuit removed")
    ax.axhline(data["dense_perplexity"], color="grey", lw=0.8, ls=":",
               label="whole text in context")
    if "dense" in edited:
        ax.axhline(edited["dense"], color="black", lw=0.8, ls="-.",
                   label="whole text, circuit removed")
    ax.set_xscale("log", base=2)
    ax.set_xticks(windows, [str(w) for w in windows])
    ax.set_yscale("log")
    ax.set_xlabel("window W (recent tokens kept)")
    ax.set_ylabel("perplexity")
    ax.set_title(f"{data['model']}: streaming perplexity, {data['scored']} tokens scored")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return save(fig, path)
