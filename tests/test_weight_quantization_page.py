"""The weight-only int4 findings page renders each model's committed result as it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from docs.build.findings import WEIGHT_QUANT_COLUMNS, weight_quantization_page
from docs.build.tables import fmt

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results" / "weight_quantization"


def _result(loss: float) -> dict:
    iv = {"mean": 0.5, "low": 0.25, "high": 0.75}
    rows = {k: {"loss": loss + i, "delta_loss": float(i), "delta_interval": iv}
            for i, (k, _) in enumerate(WEIGHT_QUANT_COLUMNS)}
    rows["fp"] = {"loss": loss}
    return {"settings": rows, "prompts": {"n": 4, "seq_len": 16}, "n_outliers_zeroed": 9,
            "super_weights": [{"layer": 2, "neuron": 7, "channel": 5, "value": -1.5}]}


def test_page_rows_hold_each_setting_and_the_super_weights():
    page = weight_quantization_page({"m": _result(2.0)})
    row = next(line for line in page.splitlines() if line.startswith("| `m` | 2"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "2" and cells[2] == "3 (+1.000 [0.25, 0.75])"
    assert cells[-1] == "9 (+7.000 [0.25, 0.75])"
    assert "| L2: 1 | L2 N7->5 (-1.5) | 4 x 16 tokens | 9 |" in page


@pytest.mark.skipif(not RESULTS.is_dir(), reason="no committed results")
def test_committed_results_render():
    data = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}
    page = weight_quantization_page(data)
    for model, d in data.items():
        assert f"| `{model}` | {fmt(d['settings']['fp']['loss'])} |" in page


def test_figure_is_drawn(tmp_path):
    from mechsink.viz.weight_quantization import weight_quantization_figure

    out = weight_quantization_figure({"a": _result(2.0), "b": _result(3.0)},
                                     tmp_path / "wq.png")
    assert out.stat().st_size > 1000 and out.read_bytes()[:4] == b"\x89PNG"
