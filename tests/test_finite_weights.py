"""Non-finite weights are refused on load and in wrap, naming the tensor, before any work."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from mechsink import load_model, wrap
from mechsink.app.cli import app
from mechsink.model.finite import NonFiniteWeightsError, check_finite_weights
from mechsink.model.zoo import load_organism_hf, organism_folder

BAD = "transformer.h.1.attn.c_attn.weight"


def _organism_with(tmp_path, name: str, value: float, count: int = 1):
    """A copy of the shipped organism whose tensor ``name`` holds ``count`` copies of ``value``."""
    folder = tmp_path / "org"
    shutil.copytree(organism_folder("bb-gpt2-tiny"), folder)
    weights = load_file(str(folder / "model.safetensors"))
    flat = weights[name].reshape(-1)
    flat[:count] = value
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_load_model_names_the_tensor_and_the_count(tmp_path):
    folder = _organism_with(tmp_path, BAD, float("inf"))
    with pytest.raises(NonFiniteWeightsError, match=rf"{BAD} .* holds 1 non-finite") as err:
        load_model(f"organism:{folder}", device="cpu")
    assert "\n" not in str(err.value)


def test_nan_counts_every_bad_value(tmp_path):
    folder = _organism_with(tmp_path, "transformer.h.0.mlp.c_fc.bias", float("nan"), count=5)
    with pytest.raises(NonFiniteWeightsError, match=r"transformer\.h\.0\.mlp\.c_fc\.bias .* 5 "):
        load_model(f"organism:{folder}", device="cpu")


def test_hf_folder_is_checked_too(tmp_path):
    folder = _organism_with(tmp_path, BAD, float("-inf"))
    with pytest.raises(NonFiniteWeightsError, match=BAD):
        load_model(f"hf:{folder}", device="cpu")


def test_wrap_refuses_a_plain_model_and_a_bridge(tmp_path):
    folder = _organism_with(tmp_path, BAD, float("inf"))
    hf, tok = load_organism_hf(folder)
    with pytest.raises(NonFiniteWeightsError, match=BAD):
        wrap(hf, tok)
    bridge = load_model("organism:bb-gpt2-tiny", device="cpu")
    p = bridge.original_model.transformer.h[1].attn.c_attn.weight  # q/k/v are views of it
    with torch.no_grad():
        p.view(-1)[3] = float("nan")
    with pytest.raises(NonFiniteWeightsError, match=BAD):  # transformers' name, not the bridge's
        wrap(bridge)


def test_finite_models_pass(gpt2_tiny):
    check_finite_weights(gpt2_tiny)
    assert wrap(gpt2_tiny) is gpt2_tiny


def test_scan_exits_with_one_line_and_writes_nothing(tmp_path):
    folder = _organism_with(tmp_path, BAD, float("inf"))
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["scan", f"organism:{folder}", "--out", str(out), "--n", "2",
                                      "--seq-len", "8", "--device", "cpu"])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())  # one message, wrapped to the terminal width
    assert message.startswith("error: weight ") and message.count("error:") == 1, result.output
    assert BAD in message and "1 non-finite" in message and "Traceback" not in message
    assert result.exception is None or isinstance(result.exception, SystemExit)
    # nothing is left behind: not even the --out folder the command made before the load
    assert not out.exists()
    # a folder that was there before stays
    out.mkdir()
    CliRunner().invoke(app, ["scan", f"organism:{folder}", "--out", str(out), "--n", "2",
                             "--seq-len", "8", "--device", "cpu"])
    assert out.is_dir()
