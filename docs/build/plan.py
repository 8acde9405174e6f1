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
#: the settings of the site's atlas (committed under docs/results/atlas, see docs.build.results):
#: a committed atlas made with other settings is refused, not shown
ATLAS = {"models": ["smollm2-135m", "gemma3-270m", "qwen2.5-0.5b", "qwen2.5-1.5b",
                    "organism:bb-gpt2-tiny", "random:llama-mini"],
         "n": 16, "seq_len": 64, "n_census": 32, "seed": 0, "eps": DEFAULT_EPS}


@dataclass(frozen=True)
class Plan:
    """Which models the site is built from, and with which settings."""

    name: str
    main: str  # the model of the concept pages, tutorials and notebooks
    scans: dict[str, dict[str, Any]]  # gallery model -> census settings
    circuit_settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # run()'s
    notebook_params: dict[str, dict[str, Any]] = field(default_factory=dict)  # besides MODEL
    # finding page -> run()'s settings; "model": the model (default: main; None: the experiment
    # trains its own); a "run_dir" of "@EXPERIMENT:PATH" is PATH inside that finding's result
    findings: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the settings the site's committed atlas must have been made with (docs.build.results)
    atlas: dict[str, Any] = field(default_factory=lambda: dict(ATLAS))


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
    {"p0_edges": {}, "gpt2_query_bias": {"model": "organism:bb-gpt2-tiny"},
     "query_bias_dose": {"model": "qwen2.5-0.5b"},
     "headwise_rmsnorm": {"model": None},
     "sink_timeline": {"model": None, "run_dir": "@headwise_rmsnorm:runs/bb-gpt2-tiny-seed0"},
     "seedprint": {"model": None}, "sink_free": {"model": None},
     "init_structure": {"model": None}},
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
    {"p0_edges": {"n": 2, "seq_len": 16, "steps": 2, "verify": 4, "n_random": 1},
     "gpt2_query_bias": {"model": "organism:bb-gpt2-tiny", "n": 4, "seq_len": 16},
     "query_bias_dose": {"model": "organism:bb-gpt2-tiny", "n": 2, "seq_len": 16},
     "headwise_rmsnorm": {"model": None, "seeds": [0], "steps": 16},
     "sink_timeline": {"model": None, "run_dir": "@headwise_rmsnorm:runs/bb-gpt2-tiny-seed0",
                       "n": 8},
     "seedprint": {"model": None, "steps": 4, "depths": [2], "n": 8, "k": 8, "null_inits": 3,
                   "held_out_inits": 2},
     "sink_free": {"model": None, "recipes": ["bb-llama-tiny"], "variants": ["softmax1", "sigmoid"],
                   "seeds": [0], "steps": [16]},
     "init_structure": {"model": None, "twins": ["random:gpt2-tiny"], "twin_seeds": [0, 1],
                        "n": 3, "seq_len": 6, "scales": [1.0, 2.0], "recipe": "bb-llama-tiny",
                        "wo_scales": [0.0, 1.0], "seeds": [0, 1], "steps": 2,
                        "seedprint_steps": 1, "null_inits": 3, "held_out_inits": 2, "k": 4}},
)
