"""`mechsink scan` draws its whole report (figures, attention page, index) on every
architecture of the suite whose census is supported, the mixtures of experts included: a figure
whose measurement the census marked not applicable is left out and the index says why, instead
of the report failing after the census was computed."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mechsink.app.cli import app
from mechsink.errors import BadInputError
from mechsink.viz.figures import FIGURES
from tests.architectures import builder, expected

ARCHS = builder.registered()

MOE = ("MixtralForCausalLM", "Qwen3MoeForCausalLM")
DENSE = ("LlamaForCausalLM",)


@pytest.mark.parametrize("arch", [*MOE, *DENSE])
def test_scan_draws_its_report(suite, arch, tmp_path):
    out = tmp_path / "scan"
    result = CliRunner().invoke(app, [
        "scan", f"hf:{suite.folder(arch)}", "--out", str(out), "--suite", "random",
        "--variant", "bos", "--n", "2", "--seq-len", "8", "--no-validate-sets",
        "--device", "cpu"])
    assert result.exit_code == 0, result.output
    run = json.loads((out / "census.json").read_text())["runs"][0]
    index = (out / "index.html").read_text()
    assert (out / "attention.html").stat().st_size > 0
    drawn = {p.name for p in out.glob("*.png")}
    if arch in MOE:  # one MLP down projection per expert: no per-layer MLP spikes
        assert "mlp_spikes" not in run and "mlp" in run["not_applicable"]
        assert drawn == set(FIGURES) - {"mlp_spikes.png"}
        assert "Not drawn for this model" in index and run["not_applicable"]["mlp"] in index
    else:
        assert drawn == set(FIGURES) and "Not drawn" not in index
    for name in drawn:
        assert f'src="{name}"' in index


@pytest.mark.slow
@pytest.mark.parametrize("arch", expected.cases("census", ARCHS))
def test_scan_draws_its_report_on_every_architecture(suite, arch, tmp_path):
    """Every architecture whose census is supported gets its whole report from the command
    line: each figure drawn or, where the census marked its measurement not applicable, named
    in the index with the reason."""
    out = tmp_path / "scan"
    result = CliRunner().invoke(app, [
        "scan", f"hf:{suite.folder(arch)}", "--out", str(out), "--suite", "random",
        "--variant", "bos", "--n", "2", "--seq-len", "8", "--device", "cpu"])
    refusal = [line for line in result.output.splitlines() if line.startswith("error: ")]
    if result.exit_code != 0 and refusal:  # mechsink's one-line refusal, as the table expects
        raise BadInputError(refusal[0])
    assert result.exit_code == 0, result.output
    index = (out / "index.html").read_text()
    drawn = {p.name for p in out.glob("*.png")}
    for name in FIGURES:
        assert (f'src="{name}"' in index) if name in drawn else (name in index), name
    assert (out / "attention.html").stat().st_size > 0
