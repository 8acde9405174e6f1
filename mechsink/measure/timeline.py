"""Sink timeline: the sink measurements at every checkpoint of a training run (when the sink forms).

For each ``step-N`` of a run folder written by :mod:`mechsink.training.loop`, the organism reads the
same held-out tokens and the census measurements are taken from its cache: Gu's sink rate and
the largest sink score at key 0, the first-token norm ratio, and the largest residual magnitude.
For an attention variant with no normalisation over keys (sigmoid attention), the sink score is
the share of the head's output mass on key 0 (:func:`mechsink.model.variants.sink_pattern`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jaxtyping import Int
from torch import Tensor

from mechsink.io import atomic_write_json
from mechsink.measure.cache import CacheLike
from mechsink.measure.forward import measure_forward, of_cache
from mechsink.measure.norms import RESID_HOOKS, first_token_norm_ratio
from mechsink.measure.sinks import DEFAULT_EPS, SinkScores, sink_scores
from mechsink.measure.sinks import HOOKS as SINK_HOOKS
from mechsink.model import hf_model_of, load_model
from mechsink.model.variants import attention_variant_of, sink_pattern

TIMELINE_SCHEMA = "mechsink-timeline/1"


@dataclass(frozen=True)
class TimelinePoint:
    """The measurements of one checkpoint."""

    step: int
    loss: float | None  # training loss of the step that produced this checkpoint
    sink_rate: float  # Gu's version, key 0, eps as given
    sink_rate_no_self: float
    max_sink_score: float  # largest mean sink score (queries i > 0) over layers and heads
    first_token_norm_ratio: float  # largest over layers
    max_abs_resid: float  # largest |x[l, p, c]| over layers, positions and channels


def measure_checkpoint(model: Any, tokens: Int[Tensor, "batch pos"], eps: float) -> dict:
    """The timeline measurements of one model on ``tokens`` (one forward)."""
    variant = attention_variant_of(hf_model_of(model))

    def sinks(cache: CacheLike) -> SinkScores:
        patterns = {n: sink_pattern(cache[n], variant) for n in cache.keys()
                    if n.endswith(SINK_HOOKS[0])}
        return sink_scores(patterns, position=0, eps=eps)

    def largest_resid(cache: CacheLike) -> float:
        return max(cache[n].abs().max().item() for n in cache.keys()
                   if n.endswith(RESID_HOOKS[0]))

    got = measure_forward(model, tokens, {
        "sinks": of_cache(SINK_HOOKS, sinks),
        "ratio": of_cache(RESID_HOOKS, first_token_norm_ratio),
        "resid": of_cache(RESID_HOOKS, largest_resid, merge=max)})
    scores = got["sinks"]
    return dict(sink_rate=scores.rate, sink_rate_no_self=scores.rate_no_self,
                max_sink_score=scores.no_self.mean(0).max().item(),
                first_token_norm_ratio=got["ratio"].mean.max().item(), max_abs_resid=got["resid"])


def sink_timeline(run_dir: str | Path, tokens: Int[Tensor, "batch pos"],
                  eps: float = DEFAULT_EPS) -> list[TimelinePoint]:
    """Measure every checkpoint of the run in ``run_dir`` on the same ``tokens``."""
    run_dir = Path(run_dir)
    run = json.loads((run_dir / "run.json").read_text())
    points = []
    for step in run["checkpoints"]:
        model = load_model(f"organism:{run_dir / f'step-{step}'}", device="cpu")
        loss = run["losses"][step - 1] if step > 0 else None
        points.append(TimelinePoint(step=step, loss=loss,
                                    **measure_checkpoint(model, tokens.to(model.cfg.device), eps)))
    return points


def timeline_dict(points: list[TimelinePoint], **meta: Any) -> dict[str, Any]:
    """A timeline as JSON-able data (schema versioned), with ``meta`` (run, eps, ...)."""
    return {"schema": TIMELINE_SCHEMA, **meta, "points": [asdict(p) for p in points]}


def write_timeline(points: list[TimelinePoint], path: str | Path, **meta: Any) -> Path:
    """Save a timeline as JSON, atomically."""
    return atomic_write_json(path, timeline_dict(points, **meta))
