"""Every entry point on CUDA gives the CPU's numbers: the census (through ``mechsink scan``),
activation patching, path patching, edge discovery and one experiment, on a tiny random model
in float32 loaded once on each device. Skipped where there is no CUDA device."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

import mechsink

DEVICE = "cuda"
MODEL = "random:llama-tiny"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.device(DEVICE).type == "cuda" and not torch.cuda.is_available(),
                       reason="no CUDA device"),
]
# float32 on both devices; CUDA's kernels sum in other orders (and TF32 is off by default)
RTOL, ATOL = 1e-3, 1e-4


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    return {d: mechsink.load_model(MODEL, device=d, dtype="float32") for d in ("cpu", DEVICE)}


def _close(a: Any, b: Any, where: str = "") -> None:
    """Two JSON-able results agree: numbers within tolerance, everything else equal."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            if k not in ("device", "seconds", "elapsed"):
                _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a is not None and b is not None, where
        both_nan = math.isnan(a) and math.isnan(b)
        assert math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL) or both_nan, \
            f"{where}: {a} vs {b}"
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


def _tensors_close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert b.device.type == "cpu" or b.device.type == torch.device(DEVICE).type
    torch.testing.assert_close(a.detach().cpu().double(), b.detach().cpu().double(),
                               rtol=RTOL, atol=ATOL, equal_nan=True)


def test_models_are_where_asked(models):
    assert {p.device.type for p in models[DEVICE].parameters()} == {torch.device(DEVICE).type}
    tokens = torch.tensor([[50256, 464, 3139, 286, 4881, 318]])
    with torch.no_grad():
        _tensors_close(models["cpu"](tokens), models[DEVICE](tokens.to(DEVICE)))


def test_scan_census(tmp_path):
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    data = {}
    for d in ("cpu", DEVICE):
        out = tmp_path / d
        result = CliRunner().invoke(app, ["scan", MODEL, "--out", str(out), "--n", "4",
                                          "--seq-len", "16", "--device", d, "--no-report"])
        assert result.exit_code == 0, result.output
        data[d] = json.loads((out / "census.json").read_text())
    _close(data["cpu"], data[DEVICE])


def test_activation_patch(models):
    from mechsink.patching import MassiveValue, activation_patch

    got = {}
    for d, model in models.items():
        clean = torch.tensor([[50256, 464, 3139, 286, 4881, 318, 6342]], device=d)
        corrupted = torch.tensor([[50256, 464, 3139, 286, 8602, 318, 6342]], device=d)
        got[d] = activation_patch(model, clean, corrupted, "resid_pre",
                                  MassiveValue(1, 0, 3))
    _tensors_close(got["cpu"].values, got[DEVICE].values)
    assert got["cpu"].values.abs().max() > 0


def test_path_patch(models):
    from mechsink.inputs.prompts import make_prompts
    from mechsink.patching import MassiveValue, path_patch

    got = {}
    for d, model in models.items():
        tokens = make_prompts(model, "natural", "bos", n=4, seq_len=16).tokens
        senders = [f"L0H{h}@0" for h in range(int(model.cfg.n_heads))] + ["MLP0@0"]
        got[d] = path_patch(model, tokens, None, senders, ["MLP1"], MassiveValue(1, 0, 3),
                            ablation="position_mean")
    _tensors_close(got["cpu"].values, got[DEVICE].values)


@pytest.mark.parametrize("method", ["eap", "eap-ig"])
def test_discover(models, method):
    from mechsink.discover import discover
    from mechsink.inputs.prompts import make_prompts
    from mechsink.patching import MassiveValue

    got = {}
    for d, model in models.items():
        tokens = make_prompts(model, "natural", "bos", n=4, seq_len=16).tokens
        got[d] = discover(model, tokens, MassiveValue(1, 0, 3), ablation="position_mean",
                          positions=[0], method=method, verify=5, steps=3)
    _tensors_close(got["cpu"].scores.values, got[DEVICE].scores.values)
    assert [int(e) for e in got["cpu"].circuit.edges] == [int(e) for e in got[DEVICE].circuit.edges]


def test_experiment_p0_sink(models):
    from mechsink.experiments import p0_sink

    got = {d: p0_sink.run(model, model_name=MODEL, n=8, seq_len=16, doses=(0.0, 0.5, 1.0))
           for d, model in models.items()}
    _close(json.loads(json.dumps(got["cpu"].data, default=str)),
           json.loads(json.dumps(got[DEVICE].data, default=str)))
