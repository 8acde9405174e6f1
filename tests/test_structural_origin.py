"""sink_readout() under interventions; the structural-origin and P0-sink experiments end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mechsink import load_model
from mechsink.experiments import p0_sink, structural_origin
from mechsink.interventions.edits import attend_only_to_self
from mechsink.interventions.readout import sink_readout
from mechsink.measure import sink_score
from mechsink.model import to_tokens

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The structural origin of the sink: variance, super neurons, dimension disparity."


def test_sink_readout_matches_a_direct_measurement_and_sees_the_mask(llama_tiny):
    tokens = to_tokens(llama_tiny, [TEXT, TEXT], prepend_bos=True)
    plain = sink_readout(llama_tiny, tokens, positions=[0, 3], include_self=False, channel=5)
    _, cache = llama_tiny.run_with_cache(tokens)
    direct = sink_score(cache["blocks.1.attn.hook_pattern"], 3, include_self=False).mean(0)
    torch.testing.assert_close(plain.scores[3][1], direct)
    torch.testing.assert_close(plain.channel_values[3][1],
                               cache["blocks.1.hook_resid_post"][:, 3, 5].mean())
    masked = sink_readout(llama_tiny, tokens, attend_only_to_self(llama_tiny, [0, 1], 3),
                          positions=[3], include_self=False)
    assert not torch.allclose(masked.scores[3], plain.scores[3])


def test_structural_origin_script_runs_end_to_end(tmp_path):
    out = tmp_path / "origin"
    subprocess.run([sys.executable, str(ROOT / "circuits" / "structural_origin.py"),
                    "--model", "random:llama-tiny", "--out", str(out), "--n", "4",
                    "--seq-len", "24", "--positions", "4", "--doses", "0", "0.5", "1",
                    "--mask-strengths", "0.5", "1", "--amplify-factors", "2", "8",
                    "--plant-factors", "1"],
                   check=True, capture_output=True, text=True)
    result = json.loads((out / "result.json").read_text())
    assert result["schema"] == "mechsink-structural-origin/3"
    curve = result["dose_response"]["creating_set"]
    assert [r["dose"] for r in curve["rows"]] == [0.0, 0.5, 1.0]
    for row in curve["rows"]:  # every figure carries its interval
        assert row["sink_rate"]["low"] <= row["sink_rate"]["mean"] <= row["sink_rate"]["high"]
    assert {r["intervention"] for r in result["move"]} == {
        "self-only mask", "variance amplified", "norm amplified", "channel planted",
        "mask + variance"}
    assert [(r["intervention"], r["dose"]) for r in result["move"]][:4] == [
        ("self-only mask", 0.5), ("self-only mask", 1.0), ("variance amplified", 2.0),
        ("variance amplified", 8.0)]
    assert len(result["move_curves"]) == 5
    for r in result["move"]:  # every figure with its interval and n; 4 prompts: not called
        assert r["intervals"]["sink_at_k_after"]["n"] == 4 and r["moved"] is None
    assert result["verdicts"]["C4"]["verdict"] == "too few prompts to call"
    assert result["verdicts"]["C3"]["verdict"] in ("too few prompts to call", "not measured")
    assert {"C1", "C2", "C3", "C4", "C2, the set that carries the sink"} <= set(
        result["verdicts"])
    validation = result["set_validation"]  # every set zeroed against a random twin, or why not
    assert "not_applicable" in validation or {"carrier_block", "sets"} <= set(validation)
    assert all(v["criterion"] for v in result["verdicts"].values())
    assert [r["condition"] for r in result["surgery"]["rows"]][0] == "clean"
    summary = (out / "summary.md").read_text()
    assert "Criterion:" in summary and "| dose |" in summary
    assert set(result["channel_life"]) == {"appears", "amplified", "removed", "peak"}
    assert (out / "structural_origin.png").is_file()


def test_circuit_command_runs_an_experiment_by_name(tmp_path):
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    runner = CliRunner()
    ok = runner.invoke(app, ["circuit", "structural_origin", "random:llama-tiny", "--out",
                             str(tmp_path / "o"), "--n", "2", "--seq-len", "16", "--positions",
                             "4", "--doses", "0", "1"])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "o" / "result.json").is_file()
    assert "Structural origin" in ok.output
    bad = runner.invoke(app, ["circuit", "no_such_thing", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "structural_origin" in bad.output
    option = runner.invoke(app, ["circuit", "structural_origin", "random:llama-tiny", "--out",
                                 str(tmp_path / "y"), "--no-such-option", "1"])
    assert option.exit_code == 2 and "--seq-len" in option.output
    assert not (tmp_path / "y").exists()  # refused before any work


def test_channel_life_finds_appearance_amplification_and_removal():
    from mechsink.experiments.structural_origin import channel_life

    life = channel_life([1.0, 20.0, 40.0, 300.0, 310.0, -5.0])
    assert [life[k]["layer"] for k in ("appears", "amplified", "peak", "removed")] == [2, 3, 4, 5]
    assert life["removed"] == {"layer": 5, "before": 310.0, "after": -5.0}
    assert channel_life([0.0, 5.0])["removed"] is None  # peak at the last block: never removed


def test_p0_sink_runs_end_to_end(tmp_path):
    out = tmp_path / "p0"
    model = load_model("random:gpt2-tiny", device="cpu", seed=0)
    p0_sink.run(model, n=2, seq_len=12, layers=1, doses=[0.0, 0.5, 1.0]).save(out)
    result = json.loads((out / "result.json").read_text())
    assert result["schema"] == "mechsink-p0-sink/3"
    assert set(result["first_token"]) == {"bos", "nobos", "randfirst"}
    extra = 1 if result["super_neuron_set"]["size"] > 1 else 0  # the complete set as one node
    assert len(result["nodes"]) == 4 + 1 + 1 + extra  # layer-0 heads, MLP0, top neuron (+ set)
    through = result["through_channel"]
    assert [r["path"].split(",")[0] for r in through["rows"]][0] == "clean"
    assert len(through["rows"]) == 4  # clean, set removed, surgery one block, every block
    assert all(v["criterion"] for v in result["verdicts"].values())
    sn_mlp = f"MLP{result['super_neuron']['layer']}"
    paths = ("via_mlp_to_channel", "via_mlp_to_sink", "direct_to_sink")
    assert len(result["edges"]) == sum(n[k] is not None for n in result["nodes"] for k in paths)
    mlp_node = next(n for n in result["nodes"] if n["name"] == sn_mlp)
    assert mlp_node["via_mlp_to_channel"] is None  # not upstream of itself: no edge through it
    assert not [e for e in result["edges"] if e["from"] == sn_mlp and e["via"]]
    assert {e["metric"] for e in result["edges"]} == {"massive_value", "sink_score"}
    assert all(e["from"] in {n["name"] for n in result["nodes"]} for e in result["edges"])
    assert (out / "p0_circuit.png").is_file()


@pytest.mark.slow
def test_structural_origin_on_smollm2_moves_the_sink():
    """The self-only mask makes position 8 a sink in the real model (Li, Jiang, Sun et al. 2026)."""
    result = structural_origin.run(load_model("smollm2-135m", device="cpu"), n=4, seq_len=32,
                                   positions=[8], doses=[0.0, 0.5, 1.0], mask_strengths=[1.0],
                                   amplify_factors=[8.0], plant_factors=[1.0]).data
    mask = next(r for r in result["move"] if r["intervention"] == "self-only mask")
    assert mask["dose"] == 1.0 and mask["sink_at_k_after"] > 5 * mask["sink_at_k_before"]
    assert result["super_neuron"]["channel"] == 507  # SmolLM2's massive channel
    assert result["super_neuron_sets"]["channel"] == 507


@pytest.mark.slow
def test_p0_sink_on_smollm2_path_patching_finds_the_super_neuron():
    """The sink at key 0 survives without BOS (Peng, Li et al. 2026), and path patching the super
    neuron's position-0 output through its MLP removes most of the massive channel (the census
    measured its contribution as about 18,000 of 24,900)."""
    result = p0_sink.run(load_model("smollm2-135m", device="cpu"), n=2, seq_len=16,
                         layers=1).data
    assert result["super_neuron"] == {"layer": 11, "neuron": 1229, "channel": 507}
    assert all(m["sink_rate"] > 0.3 for m in result["first_token"].values())
    neuron = next(n for n in result["nodes"] if n["name"] == "L11N1229")
    assert neuron["via_mlp_to_channel"] > 0.5 * result["clean"]["via_mlp_to_channel"]
    layer0 = [n for n in result["nodes"] if n["name"].startswith("L0H")]
    assert max(abs(n["via_mlp_to_channel"]) for n in layer0) < neuron["via_mlp_to_channel"]


def _check(layer, verdict, zeroed, random):
    iv = lambda m: {"mean": m, "low": m - 0.01, "high": m + 0.01}  # noqa: E731
    return {"layer": layer, "channel": 7, "size": 2, "verdict": verdict,
            "zeroed": {"late_sink_score": iv(zeroed), "sink_rate": iv(zeroed), "channel": iv(1.0)},
            "random": {"late_sink_score": iv(random), "sink_rate": iv(random), "channel": iv(9.0)}}


def test_the_carrier_verdict_and_the_atlas_c2_cell_read_the_validation():
    from mechsink.experiments.atlas import _c2_cell
    from mechsink.experiments.structural_origin import carrier_verdict

    iv = {"mean": 0.85, "low": 0.84, "high": 0.86}
    validation = {"carrier_block": 9, "n_prompts": 4,
                  "clean": {"7": {"late_sink_score": iv, "sink_rate": iv}},
                  "sets": [_check(5, "does not carry the sink", 0.86, 0.85),
                           _check(9, "carries the sink", 0.35, 0.84)]}
    v = carrier_verdict(validation)
    assert v["verdict"] == "supported" and v["carrier_block"] == "9"
    assert "block 9" in v["evidence"] and "0.35" in v["evidence"]
    validation["sets"][1]["verdict"] = "moves the sink"
    assert carrier_verdict(validation)["verdict"] == "partial"
    c2 = {"verdict": "supported", "criterion": "the channel goes", "evidence": "channel 0.1"}
    cell = _c2_cell({"C2": c2, "C2, the set that carries the sink": v}, "m/so", None)
    assert cell["verdict"] == "supported" and cell["carrier_block"] == "9"
    assert "the channel goes" in cell["criterion"] and "block 9" in cell["evidence"]
    no = {**v, "verdict": "not supported"}
    assert _c2_cell({"C2": c2, "C2, the set that carries the sink": no}, "m/so", None)[
        "verdict"] == "partial"
    assert _c2_cell({"C2": c2}, "m/so", None)["verdict"] == "supported"  # older results
    assert carrier_verdict({"not_applicable": "no set"})["verdict"] == "not measured"


@pytest.mark.slow
def test_gemma3_block_5_names_the_channel_but_block_3_carries_the_sink():
    """The issue's researcher, on Gemma-3-270M: block 5 raises channel 163 most in one step and
    its one-neuron set explains its residual write, yet zeroing it leaves the sink; zeroing block
    3's set (44 neurons on the residual write, 1 on the raw down projection) removes it."""
    from mechsink.inputs.prompts import make_prompts
    from mechsink.interventions.readout import massive_channel_sets
    from mechsink.interventions.set_validation import validate_sets
    from mechsink.model import load_model

    model = load_model("gemma3-270m", device="cpu")
    tokens = make_prompts(model, "natural", "bos", n=8, seq_len=32).tokens  # 8: called
    found = massive_channel_sets(model, tokens)
    assert found.channel == 163 and found.creating_layer == 5
    s3, s5 = found.sets[3], found.sets[5]
    assert s3.normed and len(s3.down_units) == 1 and len(s3.units) > 10  # the norm matters
    v = validate_sets(model, tokens, [s3, s5], n_boot=500)
    assert v.check(3).verdict == "carries the sink" and v.carrier == 3
    assert v.check(5).verdict == "does not carry the sink"
    rate, clean = v.check(3).zeroed.sink_rate, v.clean[163].sink_rate  # the issue: ~0.35, 0.852
    assert rate.high < clean.low and rate.mean < 0.5 * clean.mean
