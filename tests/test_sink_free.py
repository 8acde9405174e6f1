"""The sink-free comparison: twin organisms per variant, measured, tabled and re-rendered."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.experiments import ExperimentResult, get_experiment, sink_free
from mechsink.model.zoo import load_organism_hf
from mechsink.training.loop import get_recipe


def test_twins_are_measured_and_the_sigmoid_sink_score_is_output_share(tmp_path: Path) -> None:
    result = sink_free.run(work_dir=tmp_path, recipes=["bb-llama-tiny"], variants=["sigmoid"],
                           seeds=[0], steps=[1])
    task = result.data["tasks"]["bb-llama-tiny"]
    assert set(task["arms"]) == {"softmax", "sigmoid"}
    plain, sig = task["arms"]["softmax"][0], task["arms"]["sigmoid"][0]
    assert plain["losses"][0] == pytest.approx(sig["losses"][0], abs=0.2)  # same task, init
    assert [p["step"] for p in sig["timeline"]] == [0, 1]
    # independent check of the largest sink score, from transformers' own attention output:
    # for sigmoid attention, A[i, 0] / sum_j A[i, j] averaged over queries i > 0 and sequences
    hf, _ = load_organism_hf(tmp_path / "runs" / "bb-llama-tiny+sigmoid-seed0" / "step-1")
    recipe = get_recipe("bb-llama-tiny")
    tokens = recipe.task().batch(sink_free.HELD_OUT_SEED, 0, 32, recipe.seq_len)
    with torch.no_grad():
        attentions = hf(tokens, output_attentions=True).attentions
    best = max((a[..., 1:, 0] / a[..., 1:, :].sum(-1)).mean(-1).mean(0).max().item()
               for a in attentions)
    assert sig["final"]["max_sink_score"] == pytest.approx(best, rel=1e-4)
    assert task["table"]["sigmoid"]["final_loss"]["mean"] == sig["final"]["final_loss"]
    out = result.save(tmp_path / "out")
    again = ExperimentResult.load(out, "sink_free")
    assert again.summary() == (out / "summary.md").read_text()
    assert "| sigmoid |" in again.summary() and (out / sink_free.FIGURE).stat().st_size > 5_000
    # a second run reuses the trained and measured organisms
    stamp = json.loads((tmp_path / "runs" / "bb-llama-tiny-seed0" / "measured.json").read_text())
    assert sink_free.run(work_dir=tmp_path, recipes=["bb-llama-tiny"], variants=["sigmoid"],
                         seeds=[0], steps=[1]).data["tasks"]["bb-llama-tiny"]["arms"][
        "softmax"][0] == stamp["arm"]


def test_bad_settings_fail_before_training(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="unknown variant"):
        sink_free.run(work_dir=tmp_path, variants=["nope"])
    with pytest.raises(BadInputError, match="one per recipe"):
        sink_free.run(work_dir=tmp_path, steps=[1, 2, 3])
    with pytest.raises(BadInputError, match="unknown recipe"):
        sink_free.run(work_dir=tmp_path, recipes=["nope"], steps=[1])
    assert not (tmp_path / "runs").exists()
    settings = get_experiment("sink_free").parse_settings(
        ["--recipes", "bb-llama-tiny", "--steps", "5", "--variants", "softpick"])
    assert settings == {"recipes": ["bb-llama-tiny"], "steps": [5], "variants": ["softpick"]}


# --- deployment cells: streaming perplexity and int4 quantization -------------------------------


def _plain_stream_nll(hf: torch.nn.Module, row: torch.Tensor, t: int, sinks: int,
                      window: int | None) -> float:
    """-log p(row[t]) from the transformers model run on ``row[:sinks] + row[t - window:t]``
    alone, positions re-assigned 0.. (``window`` None: the whole prefix ``row[:t]``)."""
    context = row[:t] if window is None else torch.cat([row[:sinks], row[t - window:t]])
    with torch.no_grad():
        logits = hf(context[None], position_ids=torch.arange(len(context))[None]).logits
    return -torch.log_softmax(logits[0, -1].double(), -1)[row[t]].item()


def _rtn_by_hand(w: torch.Tensor, group: int = 128, bits: int = 4) -> torch.Tensor:
    """Asymmetric min-max round-to-nearest of each run of ``group`` input channels of a row."""
    out = w.clone()
    levels = 2 ** bits - 1
    for lo in range(0, w.shape[1], group):
        g = w[:, lo:lo + group]
        mn, mx = g.min(1, keepdim=True).values, g.max(1, keepdim=True).values
        scale = (mx - mn) / levels
        zero = torch.round(-mn / scale)
        out[:, lo:lo + group] = (torch.clamp(torch.round(g / scale) + zero, 0, levels)
                                 - zero) * scale
    return out


def _held_out(recipe: str) -> torch.Tensor:
    r = get_recipe(recipe)
    return r.task().batch(sink_free.HELD_OUT_SEED, 0, sink_free.HELD_OUT_SEQUENCES, r.seq_len)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ExperimentResult]:
    work = tmp_path_factory.mktemp("sink_free")
    return work, sink_free.run(work_dir=work, recipes=["bb-llama-tiny"],
                               variants=["kv_bias", "gated", "softpick"], seeds=[0],
                               steps=[2])


def test_streaming_cell_matches_a_plain_loop_over_windows(
        deployed: tuple[Path, ExperimentResult]) -> None:
    work, result = deployed
    arm = result.data["tasks"]["bb-llama-tiny"]["arms"]["kv_bias"][0]
    st = arm["streaming"]
    assert st["window"] == get_recipe("bb-llama-tiny").seq_len // 4 == 16
    assert st["first_token_is_bos"] and st["sinks"] == [0, 1]
    hf, _ = load_organism_hf(work / "runs" / "bb-llama-tiny+kv_bias-seed0" / "step-2")
    tokens = _held_out("bb-llama-tiny")
    targets = range(st["window"] + 1, tokens.shape[1])
    want = {}
    for key, sinks, window in (("0", 0, 16), ("1", 1, 16), ("dense", 0, None)):
        nll = [_plain_stream_nll(hf, row, t, sinks, window) for row in tokens for t in targets]
        want[key] = math.exp(sum(nll) / len(nll))
    assert st["perplexity"]["0"] == pytest.approx(want["0"], rel=1e-5)
    assert st["perplexity"]["1"] == pytest.approx(want["1"], rel=1e-5)
    assert st["dense_perplexity"] == pytest.approx(want["dense"], rel=1e-5)
    assert arm["final"]["stream_ratio"] == pytest.approx(want["0"] / want["1"], rel=1e-5)
    assert arm["final"]["stream_ppl_s1"] == st["perplexity"]["1"]
    assert st["perplexity"]["0"] != pytest.approx(st["perplexity"]["1"], rel=1e-6)


def test_int4_loss_change_matches_weights_quantized_by_hand(
        deployed: tuple[Path, ExperimentResult]) -> None:
    work, result = deployed
    arm = result.data["tasks"]["bb-llama-tiny"]["arms"]["gated"][0]
    hf, _ = load_organism_hf(work / "runs" / "bb-llama-tiny+gated-seed0" / "step-2")
    tokens = _held_out("bb-llama-tiny")

    def loss() -> float:
        with torch.no_grad():
            logits = hf(tokens).logits.double()
        nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                tokens[:, 1:].flatten(), reduction="none")
        return nll.view(tokens.shape[0], -1).mean(1).mean().item()

    fp = loss()
    linear = [m for n, m in hf.named_modules()
              if isinstance(m, torch.nn.Linear) and n != "lm_head"]
    assert len(linear) == 16  # q, k, v, o, the gate and the three MLP weights, two layers
    with torch.no_grad():
        for m in linear:
            m.weight.copy_(_rtn_by_hand(m.weight))
    q = loss()
    cell = arm["quantization"]
    assert cell["n_linear"] == 16 and cell["group_size"] == 128
    assert cell["fp_loss"] == pytest.approx(fp, abs=1e-5)
    assert arm["final"]["int4_delta_loss"] == pytest.approx(q - fp, abs=2e-6)
    assert abs(q - fp) > 1e-5  # the quantization changed the loss: the check is not vacuous
    assert "model.layers.*.self_attn.o_proj.gate.bias" in cell["full_precision"]


def test_a_bypassed_variant_and_a_short_text_are_refused(
        deployed: tuple[Path, ExperimentResult]) -> None:
    from mechsink.model import load_model

    work, _ = deployed
    folder = work / "runs" / "bb-llama-tiny+softpick-seed0" / "step-2"
    reference, _ = load_organism_hf(folder)
    tokens = _held_out("bb-llama-tiny")[:4]
    model = load_model(f"organism:{folder}", device="cpu")
    short = sink_free.streaming_cell(model, reference, tokens[:, :2])
    assert "scores nothing" in short["not_applicable"]
    # the bridge's attention falls back to plain softmax: what a path that bypassed the
    # variant (e.g. a KV-cache path computing attention itself) would measure (a bypassed
    # kv_bias fails loudly instead: its output step finds no slot share)
    for module in model.modules():
        if "_masked_softmax" in vars(module):
            del module._masked_softmax
    cells = sink_free.deployment(model, reference, tokens)
    for cell in cells.values():
        assert "not the organism's own" in cell["not_applicable"]
        assert "softpick attention" in cell["not_applicable"]
    finals = sink_free.deploy_finals(cells)
    assert set(finals) == set(sink_free.DEPLOY_METRICS)
    assert all("not_applicable" in v for v in finals.values())
    cell = sink_free.seed_cell([1.0, finals["int4_delta_loss"]])
    assert cell == finals["int4_delta_loss"]


def test_summary_shows_the_deployment_columns_and_what_did_not_apply(
        deployed: tuple[Path, ExperimentResult]) -> None:
    _, result = deployed
    text = result.summary()
    for title in sink_free.DEPLOY_METRICS.values():
        assert f"| {title} " in text
    assert "streaming window W = 16" in text
    row = next(line for line in text.splitlines() if line.startswith("| kv_bias |"))
    assert row.count("|") == len(sink_free.METRICS) + 2 and "n/a" not in row
    data = copy.deepcopy(result.data)
    data["tasks"]["bb-llama-tiny"]["table"]["gated"]["stream_ratio"] = {"not_applicable": "why"}
    text = sink_free.summary(data)
    assert "n/a [1]" in text and "1. why" in text
    old = copy.deepcopy(result.data)  # a schema-1 result renders its own five columns
    for row in old["tasks"]["bb-llama-tiny"]["table"].values():
        for m in sink_free.DEPLOY_METRICS:
            del row[m]
    assert "streaming ppl" not in sink_free.summary(old).split("## ")[1]


def test_an_older_measurement_is_measured_again(
        deployed: tuple[Path, ExperimentResult]) -> None:
    work, _ = deployed
    measured = work / "runs" / "bb-llama-tiny-seed0" / "measured.json"
    new = json.loads(measured.read_text())
    stale = {k: v for k, v in new["arm"].items() if k not in ("streaming", "quantization")}
    stale["final"] = {k: v for k, v in stale["final"].items()
                      if k in sink_free.TIMELINE_METRICS}
    old_key = {"steps": 2, "eps": new["key"]["eps"], "held_out_seed": sink_free.HELD_OUT_SEED}
    measured.write_text(json.dumps({"key": old_key, "arm": stale}))
    again = sink_free.run(work_dir=work, recipes=["bb-llama-tiny"], variants=[], seeds=[0],
                          steps=[2])
    arm = again.data["tasks"]["bb-llama-tiny"]["arms"]["softmax"][0]
    assert arm["final"]["stream_ppl_s0"] == new["arm"]["final"]["stream_ppl_s0"]
    assert arm["quantization"] == new["arm"]["quantization"]
    rewritten = json.loads(measured.read_text())
    assert rewritten["key"] == sink_free.measurement_key(2, new["key"]["eps"], 64)
    assert rewritten["key"]["schema"] == sink_free.SCHEMA == "mechsink-sink-free/2"
