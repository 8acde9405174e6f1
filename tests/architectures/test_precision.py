"""Half precision on CPU (what a GPU user runs) against float32: every entry point (census,
activation patching, path patching, discovery EAP and exact edges, the interventions readout)
on tiny models of four families (GPT-2; Llama; Gemma 2 with its soft-caps and post-norms;
GPT-NeoX, fused QKV), each quantity within the tolerance the docs state; and a value beyond
float16's range is stated (the census) or an error naming the dtype (the other entry points),
never a silent inf.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from tests.architectures import builder

#: the largest |logit difference| from float32, relative to the largest |logit| (the docs)
TOLERANCE = {"bfloat16": 0.05, "float16": 0.01}
FAMILIES = ["LlamaForCausalLM", "GPT2LMHeadModel", "Gemma2ForCausalLM", "Qwen2ForCausalLM",
            "GPTNeoXForCausalLM", "PhiForCausalLM"]
#: the families every entry point runs on in half precision
ENTRY_FAMILIES = ["GPT2LMHeadModel", "LlamaForCausalLM", "Gemma2ForCausalLM",
                  "GPTNeoXForCausalLM"]
HALF = ("bfloat16", "float16")

#: quantity -> (how the difference is scaled, tolerance per dtype); the docs page's table.
#: "abs": max |difference| (sink scores live in [0, 1]); "rel": max |difference| / the
#: float32 quantity's largest |value|; "metric": max |difference| / the largest |value| among
#: the float32 result and the metric on the clean and corrupted runs (a patching effect is a
#: difference of two metric values, so its error scales with the metric, not the effect).
QUANTITIES: dict[str, tuple[str, dict[str, float]]] = {
    "census sink scores": ("abs", {"bfloat16": 0.005, "float16": 0.0005}),
    "census massive top-3": ("rel", {"bfloat16": 0.015, "float16": 0.002}),
    "census norm ratio": ("rel", {"bfloat16": 0.005, "float16": 0.001}),
    "census head norms": ("rel", {"bfloat16": 0.006, "float16": 0.001}),
    "activation patching, logit_diff": ("metric", {"bfloat16": 0.12, "float16": 0.015}),
    "activation patching, sink_score": ("abs", {"bfloat16": 0.003, "float16": 0.0005}),
    "path patching, logit_diff": ("metric", {"bfloat16": 0.06, "float16": 0.01}),
    "discovery EAP": ("metric", {"bfloat16": 0.1, "float16": 0.01}),
    "discovery exact edges": ("metric", {"bfloat16": 0.1, "float16": 0.015}),
    "readout sink scores": ("abs", {"bfloat16": 0.003, "float16": 0.0005}),
    "readout loss": ("rel", {"bfloat16": 0.01, "float16": 0.0015}),
}
#: (family, dtype) whose EAP gradients leave float16's range already in float32: none since the
#: suite's models have a live BOS row (a zero one, as pad_token_id = BOS gave, put layer 0's
#: value-input gradient at 2e5 on Llama and 2e8 on Gemma 2: the case the test below rebuilds)
EAP_OVERFLOWS: set[tuple[str, str]] = set()


def test_the_docs_state_the_tolerances_tested_here():
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "reference" / "architectures.md"
    text = page.read_text(encoding="utf-8")
    for name, (kind, tol) in QUANTITIES.items():
        row = f"| {name} | {kind} | {tol['bfloat16']:g} ("
        assert row in text and f") | {tol['float16']:g} (" in text.split(row)[1][:40], name


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("precision")
    return {a: builder.save(a, root).folder for a in FAMILIES}


@pytest.fixture(scope="module")
def loaded(folders):
    """(family, dtype) -> the model loaded through ``hf:<folder>`` (each once)."""
    import mechsink

    cache: dict[tuple[str, str], Any] = {}

    def get(arch: str, dtype: str) -> Any:
        if (arch, dtype) not in cache:
            cache[arch, dtype] = mechsink.load_model(f"hf:{folders[arch]}", device="cpu",
                                                     dtype=dtype)
        return cache[arch, dtype]

    return get


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("arch", FAMILIES)
def test_half_precision_logits_within_the_stated_tolerance(loaded, arch, dtype):
    tokens = torch.tensor(builder.PROBE)
    with torch.no_grad():
        ref = loaded(arch, "float32")(tokens).double()
        got = loaded(arch, dtype)(tokens)
    assert got.dtype == getattr(torch, dtype)
    diff = ((got.double() - ref).abs().max() / ref.abs().max()).item()
    assert 0 < diff <= TOLERANCE[dtype]


# --- every entry point ----------------------------------------------------------------------

CLEAN = torch.tensor(builder.PROBE)
CORRUPTED = CLEAN.clone()
CORRUPTED[:, 3] = torch.tensor([30, 5])


def _entry_points(model: Any, arch: str, dtype: str) -> dict[str, tuple[torch.Tensor, float]]:
    """quantity -> (values, the metric's largest |value| on the clean / corrupted runs)."""
    from mechsink.discover.graph_run import GraphRun
    from mechsink.discover.methods.eap import eap
    from mechsink.discover.methods.exact import exact_scores
    from mechsink.inputs.prompts import PromptSet
    from mechsink.interventions.readout import measure
    from mechsink.measure.census import census
    from mechsink.patching import LogitDiff, SinkScore, activation_patch, path_patch

    def scale(*results: Any) -> float:
        return max(abs(v) for r in results for v in (r.clean_value, r.corrupted_value or 0.0))

    got = census(model, prompts=[PromptSet("custom", "given", CLEAN)], batch_size=2,
                 progress=lambda *a: None).runs[0].measurements
    out = {"census sink scores": (got["sinks"].gu, 0.0),
           "census massive top-3": (got["massive"].top3, 0.0),
           "census norm ratio": (got["norm_ratio"].values, 0.0),
           "census head norms": (got["heads"].norms, 0.0)}
    metric = LogitDiff(3, 17)
    act = activation_patch(model, CLEAN, CORRUPTED, "resid_pre", metric)
    out["activation patching, logit_diff"] = (act.values, scale(act))
    sink = activation_patch(model, CLEAN, CORRUPTED, "z", SinkScore(1))
    out["activation patching, sink_score"] = (sink.values, 0.0)
    path = path_patch(model, CLEAN, CORRUPTED, ["L0H0", "L0H1", "L0H2", "L0H3", "MLP0"],
                      ["metric"], metric)
    out["path patching, logit_diff"] = (path.values, scale(path))
    run = GraphRun(model, CLEAN, metric, corrupted=CORRUPTED)
    if (arch, dtype) not in EAP_OVERFLOWS:
        edges = eap(run, verify=0)
        out["discovery EAP"] = (edges.values, scale(edges))
    exact = exact_scores(run)
    out["discovery exact edges"] = (exact.values, scale(exact))
    readout = measure(model, CLEAN)
    out["readout sink scores"] = (readout.scores, 0.0)
    out["readout loss"] = (readout.loss, 0.0)
    return out


@pytest.fixture(scope="module")
def entry_results(loaded):
    cache: dict[tuple[str, str], dict[str, tuple[torch.Tensor, float]]] = {}

    def get(arch: str, dtype: str) -> dict[str, tuple[torch.Tensor, float]]:
        if (arch, dtype) not in cache:
            cache[arch, dtype] = _entry_points(loaded(arch, dtype), arch, dtype)
        return cache[arch, dtype]

    return get


def difference(kind: str, got: torch.Tensor, ref: torch.Tensor, metric_scale: float) -> float:
    """The difference of one quantity from float32, scaled as :data:`QUANTITIES` says."""
    err = (got.double() - ref.double()).abs().max().item()
    if kind == "abs":
        return err
    largest = ref.double().abs().max().item()
    return err / max(largest, metric_scale if kind == "metric" else 0.0, 1e-12)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("arch", ENTRY_FAMILIES)
def test_every_entry_point_in_half_precision_within_the_stated_tolerance(
        entry_results, arch, dtype, record_property):
    ref, got = entry_results(arch, "float32"), entry_results(arch, dtype)
    diffs = {}
    for name, (kind, _) in QUANTITIES.items():
        if name not in got:
            continue
        values, metric_scale = got[name]
        assert values.shape == ref[name][0].shape, name
        assert torch.isfinite(values).all(), name
        diffs[name] = difference(kind, values, ref[name][0], ref[name][1])
    record_property("diffs", diffs)
    over = {n: d for n, d in diffs.items() if not d <= QUANTITIES[n][1][dtype]}
    assert not over, f"{arch} {dtype}: beyond the stated tolerance: {over}"
    assert any(d > 0 for d in diffs.values())  # really computed in half precision


@pytest.mark.parametrize("arch", ["LlamaForCausalLM", "Gemma2ForCausalLM"])
def test_gradients_beyond_float16_are_an_error_naming_the_dtype(folders, arch):
    """A zero BOS embedding row (position 0 all zeros; RMSNorm then divides by its eps) puts
    layer 0's value-input gradient beyond 65504: EAP refuses, naming the dtype."""
    import mechsink
    from mechsink.discover.graph_run import GraphRun
    from mechsink.discover.methods.eap import eap
    from mechsink.errors import BadInputError
    from mechsink.patching import LogitDiff

    model = mechsink.load_model(f"hf:{folders[arch]}", device="cpu", dtype="float16")
    with torch.no_grad():
        model.original_model.get_input_embeddings().weight[builder.BOS].zero_()
    run = GraphRun(model, CLEAN, LogitDiff(3, 17), corrupted=CORRUPTED)
    with pytest.raises(BadInputError, match="float16, whose largest value is 65504.*bfloat16"):
        eap(run, verify=0)


def test_a_metric_beyond_float16_is_an_error_naming_the_dtype(folders):
    """A logit pushed past 65504 in float16 is inf: the patching engine refuses the metric
    and says to load the model in bfloat16 or float32."""
    import mechsink
    from mechsink.errors import BadInputError
    from mechsink.patching import LogitDiff, activation_patch

    model = mechsink.load_model(f"hf:{folders['LlamaForCausalLM']}", device="cpu",
                                dtype="float16")
    with torch.no_grad():  # token 3's unembedding row: its logit beyond float16's range
        model.original_model.lm_head.weight[3].fill_(60000.0)
    with pytest.raises(BadInputError, match="returned (-?inf|nan) on the clean run.*float16, "
                                            "whose largest value is 65504.*bfloat16"):
        activation_patch(model, CLEAN, CORRUPTED, "resid_pre", LogitDiff(3, 17))


def test_the_readout_refuses_a_residual_beyond_float16_naming_the_dtype(folders):
    """The interventions readout would run on into NaN losses and channels: the first inf in
    the residual stream is an error naming the hook and the dtype; its hooks are removed."""
    import mechsink
    from mechsink.errors import BadInputError
    from mechsink.interventions.readout import measure

    model = mechsink.load_model(f"hf:{folders['LlamaForCausalLM']}", device="cpu",
                                dtype="float16")
    with torch.no_grad():
        model.original_model.model.layers[0].mlp.down_proj.weight[3].fill_(60000.0)
    with pytest.raises(BadInputError, match="blocks.0.hook_resid_post holds inf.*float16.*"
                                            "bfloat16"):
        measure(model, CLEAN, channels=[3])
    assert not any(h._forward_hooks for h in model.hook_dict.values())


def test_a_massive_activation_beyond_float16_is_stated_by_the_census(folders):
    """A residual channel pushed past 65504 in float16 becomes inf: the census says where, in
    its not_applicable object, instead of writing inf (or None) as a massive value."""
    import mechsink
    from mechsink.inputs.prompts import PromptSet
    from mechsink.measure.census import census

    model = mechsink.load_model(f"hf:{folders['LlamaForCausalLM']}", device="cpu",
                                dtype="float16")
    with torch.no_grad():  # one huge output weight: channel 3 of layer 0's MLP write
        model.original_model.model.layers[0].mlp.down_proj.weight[3].fill_(60000.0)
    got = census(model, prompts=[PromptSet("custom", "given", torch.tensor(builder.PROBE))],
                 batch_size=2, progress=lambda *a: None).to_dict()["runs"][0]
    why = got["not_applicable"]["massive"]
    assert "channel 3" in why and "layer 0" in why and "65504" in why
    assert all(not (isinstance(v, float) and math.isinf(v)) for v in _floats(got))


def _floats(data: Any) -> list[Any]:
    if isinstance(data, dict):
        return [x for v in data.values() for x in _floats(v)]
    if isinstance(data, list):
        return [x for v in data for x in _floats(v)]
    return [data]


# --- bfloat16 on every architecture (the support matrix's bf16 column) ----------------------

def _bf16_cases() -> list:
    from tests.architectures import expected
    from tests.architectures.test_architectures import ARCHS

    return expected.cases("bf16", ARCHS)


@pytest.mark.slow
@pytest.mark.parametrize("arch", _bf16_cases())
def test_bfloat16_logits_and_census_sinks_within_the_stated_tolerance(suite, arch,
                                                                      record_property):
    """Every architecture of the suite loaded in bfloat16 through ``hf:<folder>``: its logits
    within the docs' bfloat16 tolerance of transformers' float32 logits (relative to the
    largest |logit|), and its census sink scores within the census tolerance (absolute) of the
    hand computation from transformers' float32 eager attentions. A census that refuses the
    model in float32 refuses it in bfloat16 with the same line. ``diff``: the larger of the
    two differences (the matrix's bf16 column)."""
    import mechsink
    from mechsink.errors import BadInputError
    from mechsink.inputs.prompts import PromptSet
    from mechsink.measure.census import census

    m = suite.get(arch)
    half = mechsink.load_model(f"hf:{m.folder}", device="cpu", dtype="bfloat16")
    with torch.no_grad():
        got = half(m.tokens)
    assert got.dtype == torch.bfloat16
    logit_diff = ((got.double() - m.logits.double()).abs().max()
                  / m.logits.double().abs().max()).item()
    diffs = {"logits": logit_diff}
    prompts = [PromptSet("custom", "given", m.tokens)]
    try:
        sinks = census(half, prompts=prompts, batch_size=2, progress=lambda *a: None
                       ).runs[0].sinks.gu
    except BadInputError as exc:  # refused: float32 must refuse it with the same line
        with pytest.raises(BadInputError) as f32:
            census(m.bridge, prompts=prompts, batch_size=2, progress=lambda *a: None)
        assert str(f32.value) == str(exc)
    else:
        want = torch.stack([a[:, :, :, 0].mean(-1) for a in m.attentions], 1)
        assert torch.isfinite(sinks).all()
        diffs["sinks"] = (sinks.double() - want.double()).abs().max().item()
    record_property("diff", max(diffs.values()))
    record_property("diffs", diffs)
    assert 0 < logit_diff <= TOLERANCE["bfloat16"], diffs  # really computed in bfloat16
    assert diffs.get("sinks", 0.0) <= QUANTITIES["census sink scores"][1]["bfloat16"], diffs
