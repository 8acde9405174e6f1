"""What the site is built from: the paths, and the models and settings of a full or quick build."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mechsink.measure.sinks import DEFAULT_EPS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG = ROOT / "mkdocs.yml"
CACHE_VERSION = 1  # bump to invalidate every cached result
GALLERY_SCHEMA = "mechsink-gallery/1"
GALLERY_SEQ_LEN = 32
NOTEBOOKS = ("sink_census_walkthrough", "patching_walkthrough", "researcher_tour")
SNIPPETS = ("quickstart", "activation_patching", "path_patching", "interventions")
CIRCUITS = ("structural_origin", "p0_sink")  # experiments of mechsink.experiments


@dataclass(frozen=True)
class Plan:
    """Which models the site is built from, and with which settings."""

    name: str
    main: str  # the model of the concept pages, tutorials and notebooks
    scans: dict[str, dict[str, Any]]  # gallery model -> census settings
    circuit_settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # run()'s
    notebook_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # besides MODEL


SCAN_DEFAULTS = {"n": 32, "seq_len": 64, "eps": DEFAULT_EPS, "seed": 0, "batch_size": 8}

FULL = Plan(
    "full", "smollm2-135m",
    {"smollm2-135m": {**SCAN_DEFAULTS},
     "gemma3-270m": {**SCAN_DEFAULTS, "n": 8},
     "qwen2.5-0.5b": {**SCAN_DEFAULTS, "n": 8},
     "organism:bb-gpt2-tiny": {**SCAN_DEFAULTS},
     "random:llama-small": {**SCAN_DEFAULTS, "n": 8}},
    {"structural_origin": {}, "p0_sink": {}},
    {"sink_census_walkthrough": {"N": 8, "SEQ_LEN": 64},
     "researcher_tour": {"N": 8, "SEQ_LEN": 32}},
)
QUICK = Plan(
    "quick", "random:llama-tiny",
    {"random:llama-tiny": {**SCAN_DEFAULTS, "n": 4, "seq_len": 32},
     "organism:bb-gpt2-tiny": {**SCAN_DEFAULTS, "n": 4, "seq_len": 32}},
    {"structural_origin": {"n": 4, "seq_len": 32, "positions": [8, 16],
                           "doses": [0.0, 0.5, 1.0, 2.0]},
     "p0_sink": {"n": 4, "seq_len": 32}},
    {"sink_census_walkthrough": {"N": 4, "SEQ_LEN": 32},
     "researcher_tour": {"N": 4, "SEQ_LEN": 16}},
)
