"""The census, census.json and `mechsink scan`: reproducible, atomic, clear about bad input."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from mechsink.app.cli import app
from mechsink.errors import BadInputError
from mechsink.inputs.prompts import make_prompts, prompts_from_tokens
from mechsink.measure.census import SCHEMA, census, census_json, read_census, write_census
from mechsink.measure.sinks import sink_scores

SMALL = dict(suites=("random", "repeated"), variants=("bos", "randfirst"), n=3, seq_len=8,
             batch_size=2)


@pytest.fixture(scope="module")
def small_census(llama_tiny):
    return census(llama_tiny, seed=5, **SMALL)


def test_same_seed_gives_identical_census_json(llama_tiny, small_census, tmp_path):
    again = census(llama_tiny, seed=5, **SMALL)
    a = write_census(small_census, tmp_path / "a").read_bytes()
    b = write_census(again, tmp_path / "b").read_bytes()
    assert a == b
    other = census(llama_tiny, seed=6, **SMALL)
    assert census_json(other) != a.decode()


def test_census_json_schema(llama_tiny, small_census, tmp_path):
    data = read_census(write_census(small_census, tmp_path))
    assert data["schema"] == SCHEMA
    assert [r["name"] for r in data["runs"]] == ["random/bos", "random/randfirst",
                                                "repeated/bos", "repeated/randfirst"]
    n_layers, n_heads = llama_tiny.cfg.n_layers, llama_tiny.cfg.n_heads
    for run in data["runs"]:
        assert len(run["sink_score"]) == n_layers and len(run["sink_score"][0]) == n_heads
        assert 0.0 <= run["sink_rate"] <= 1.0
        assert isinstance(run["massive_activations"], list)
        assert isinstance(run["super_neurons"], list)
        assert len(run["first_token_norm_ratio"]) == n_layers
        assert len(run["value_drain"][0]) == 2  # per KV head (llama-tiny: 4 q / 2 kv heads)
        assert len(run["key_bias_cosine"]["first"][0]) == n_heads
        assert len(run["variance_discrepancy"]["variance"][0]) == 8
        ex = run["attention_example"]
        assert len(ex["tokens"]) == 8 and len(ex["heads"]) == 4
        assert [len(row) for row in ex["heads"][0]["pattern"]] == list(range(1, 9))
        assert run["n"] == 3 and run["seq_len"] == 8 and len(run["tokens_sha256"]) == 64


def test_census_sink_scores_equal_the_measurement_on_one_forward(llama_tiny, small_census):
    """Chunking (batch_size=2 over n=3) changes nothing: same numbers as one forward of all."""
    tokens = make_prompts(llama_tiny, "random", "bos", n=3, seq_len=8, seed=5).tokens
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(llama_tiny.cfg.n_layers)]
    _, cache = llama_tiny.run_with_cache(tokens, names_filter=names, return_type=None)
    direct = sink_scores(cache)
    got = small_census.run("random", "bos").sinks
    assert got.gu.shape == direct.gu.shape
    assert (got.gu - direct.gu).abs().max() < 1e-6


def test_census_on_given_prompts(gpt2_tiny):
    import torch

    ids = torch.randint(0, 50000, (2, 6), generator=torch.Generator().manual_seed(0))
    c = census(gpt2_tiny, prompts=[prompts_from_tokens(gpt2_tiny, ids, name="mine")])
    assert [r.name for r in c.runs] == ["mine/given"]
    assert c.settings["suites"] == ["mine"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(suites=("natural", "poetry")), "unknown suite"),
        (dict(seq_len=300), "longer than the model's context"),
        (dict(n=0), "positive integer"),
        (dict(seq_len=0), "at least 2"),
        (dict(eps=0.0), "eps"),
        (dict(eps=1.0), "eps"),
        (dict(batch_size=0), "batch_size"),
    ],
)
def test_census_bad_input_is_a_clear_error(gpt2_tiny, kwargs, match):
    args = dict(n=2, seq_len=8) | kwargs
    with pytest.raises(BadInputError, match=match):
        census(gpt2_tiny, **args)


def test_write_census_is_atomic(small_census, tmp_path):
    target = tmp_path / "out"
    data = small_census.to_dict()
    data["runs"][0]["sink_rate"] = {1: 2, "1": 3}  # keys that collide: serialising must fail
    with pytest.raises(TypeError):
        write_census(data, target)
    assert not (target / "census.json").exists()
    assert not list(tmp_path.rglob("*.part"))
    # a non-finite number is strict JSON: null, with the reason beside it (never NaN)
    data["runs"][0]["sink_rate"] = float("nan")
    written = json.loads(write_census(data, target).read_text())
    assert written["runs"][0]["sink_rate"] is None
    assert "NaN" in written["runs"][0]["sink_rate_reason"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(BadInputError, match="is a file"):
        write_census(small_census, tmp_path / "file")


# --- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--suite", "poetry"], "unknown suite"),
        (["--n", "0"], "positive integer"),
        (["--seq-len", "0"], "at least 2"),
        (["--eps", "1.5"], "eps"),
        (["--eps", "0"], "eps"),
        (["--seq-len", "300"], "longer than the model's context"),
    ],
)
def test_scan_bad_input_exits_clearly_and_writes_nothing(tmp_path, args, match):
    out = tmp_path / "report"
    result = CliRunner().invoke(app, ["scan", "random:gpt2-tiny", "--out", str(out), *args])
    assert result.exit_code == 2, result.output
    assert re.search(match, " ".join(result.output.split()))
    assert not (out / "census.json").exists()


def test_scan_out_is_a_file(tmp_path):
    f = tmp_path / "taken"
    f.write_text("not a folder")
    result = CliRunner().invoke(app, ["scan", "random:gpt2-tiny", "--out", str(f)])
    assert result.exit_code == 2 and "is a file" in " ".join(result.output.split())
    assert f.read_text() == "not a folder"


def test_scan_writes_census_figures_and_an_offline_report(tmp_path):
    out = tmp_path / "report"
    result = CliRunner().invoke(app, [
        "scan", "random:llama-tiny", "--out", str(out), "--n", "2", "--seq-len", "8",
        "--suite", "random", "--suite", "natural", "--variant", "bos", "--variant", "nobos",
        "--seed", "1",
    ])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "census.json").read_text())
    assert [r["name"] for r in data["runs"]] == ["random/bos", "random/nobos", "natural/bos",
                                                "natural/nobos"]
    assert data["settings"]["n"] == 2 and data["settings"]["seq_len"] == 8
    for name in ("sink_scores.png", "magnitudes.png", "norm_ratio.png", "mlp_spikes.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "attention.html").read_text()
    assert "CircuitsVis.render(" in page and "var CircuitsVis" in page
    from mechsink.viz.attention import external_scripts

    assert external_scripts(page) == []
    assert not re.search(r"<script[^>]*\bsrc=", page)
    assert "import " not in page.split("<script>")[-1]  # the render calls load nothing
    index = (out / "index.html").read_text()
    for link in ("census.json", "attention.html", "sink_scores.png", "magnitudes.png"):
        assert link in index
    assert "http://" not in index and "https://" not in index
    assert "random/bos" in result.output  # the summary table


@pytest.mark.slow
def test_smollm2_census_finds_massive_activations_at_position_0(smollm2):
    # measurements only; the sets' validation (mechsink.jobs.census): test_chain
    c = census(smollm2, suites=("natural",), variants=("bos",), n=4, seq_len=64, batch_size=4)
    run = c.run("natural", "bos")
    by_layer = [a for a in run.massive.activations("layer") if a.position == 0]
    assert by_layer, "no massive activation at position 0 (layer-median reference)"
    assert max(a.max_abs for a in by_layer) > 1000
    assert run.sinks.rate > 0.3
    assert any(s.position == 0 for s in run.mlp.super_neurons())


# --- the registry: a census measurement is one entry --------------------------------------------


def test_a_new_census_measurement_is_one_entry(llama_tiny):
    """An entry of one's own next to the registry's: measured from the same chunks, merged,
    written into each run's JSON, and equal to the value computed by hand from one forward."""
    import torch

    from mechsink.measure.norms import PerSequence
    from mechsink.measure.registry import CENSUS_MEASUREMENTS, CensusMeasurement

    def largest(cache, context):
        return PerSequence("largest_resid", torch.stack(
            [cache[f"blocks.{layer}.hook_resid_post"].abs().amax((1, 2))
             for layer in range(llama_tiny.cfg.n_layers)], 1))

    entry = CensusMeasurement("largest", ("hook_resid_post",), largest)
    c = census(llama_tiny, ["random"], ["bos"], n=3, seq_len=8, batch_size=2, seed=5,
               measurements=[*CENSUS_MEASUREMENTS, entry])
    tokens = make_prompts(llama_tiny, "random", "bos", n=3, seq_len=8, seed=5).tokens
    _, cache = llama_tiny.run_with_cache(tokens)
    by_hand = torch.stack([cache[f"blocks.{layer}.hook_resid_post"].abs().amax((1, 2))
                           for layer in range(llama_tiny.cfg.n_layers)], 1).double().mean(0)
    run = c.run("random", "bos")
    torch.testing.assert_close(run.largest.mean, by_hand)
    assert run.to_dict()["largest_resid"] == pytest.approx(by_hand.tolist(), rel=1e-5)
    plain = census(llama_tiny, ["random"], ["bos"], n=3, seq_len=8, batch_size=2, seed=5)
    assert "largest_resid" not in plain.run("random", "bos").to_dict()
    with pytest.raises(BadInputError, match="distinct"):
        census(llama_tiny, n=2, seq_len=8, measurements=[*CENSUS_MEASUREMENTS, entry, entry])
    with pytest.raises(BadInputError, match="'sinks'"):
        census(llama_tiny, n=2, seq_len=8, measurements=[entry])


# --- one measurement that cannot apply never ends the census (issue 25) -------------------------


def _tiny_census(arch, tmp_path):
    import torch

    import mechsink
    from mechsink.inputs.prompts import PromptSet
    from mechsink.measure.census import census
    from tests.architectures import builder

    folder = builder.save(arch, tmp_path).folder
    model = mechsink.load_model(f"hf:{folder}", device="cpu")
    return census(model, prompts=[PromptSet("custom", "given", torch.tensor(builder.PROBE))],
                  batch_size=2, progress=lambda *a: None)


def test_census_of_a_fused_qkv_model_measures_the_key_bias(tmp_path):
    """GPT-NeoX: the bridge's rotary hooks fire (mechsink.model.patches.attention_hooks; before,
    the key-bias cosine was not applicable there, and it raised "the cache holds no
    'blocks.<l>.attn.hook_q'" before that): every measurement is there."""
    run = _tiny_census("GPTNeoXForCausalLM", tmp_path).to_dict()["runs"][0]
    assert not run.get("not_applicable")
    assert len(run["key_bias_cosine"]["first"][0]) == 4 and run["sink_rate"] is not None
    assert run["super_neurons"] is not None


def test_census_of_a_mixture_of_experts_measures_all_but_super_neurons(tmp_path):
    """Mixtral: no single MLP down projection; the census refused the model before."""
    from mechsink.measure.census import census_json, summary_rows

    c = _tiny_census("MixtralForCausalLM", tmp_path)
    data = c.to_dict()
    run = data["runs"][0]
    assert set(run["not_applicable"]) == {"mlp", "super_sets"}
    assert "mixture-of-experts" in run["not_applicable"]["mlp"]
    assert "key_bias_cosine" in run and "massive_activations" in run
    assert summary_rows(data)[0]["super_neurons"] == []
    census_json(c)  # serialisable


def test_census_frame_counts_both_massive_rules():
    """The frame (and the notebook card drawn from it) shows the layer-median rule too: SmolLM2's
    channels are massive against the layer's median, not against the token's."""
    from mechsink.measure.census import census_frame

    act = {"layer": 3, "position": 0, "channel": 7, "max_abs": 900.0}
    run = {"name": "natural/bos", "sink_rate": 0.5, "sink_rate_no_self": 0.4,
           "massive_activations": [], "massive_activations_layer_median": [act],
           "super_neurons": [], "first_token_norm_ratio": [2.0, None]}
    frame = census_frame({"runs": [run]})
    row = frame.iloc[0]
    assert row["massive"] == 0 and row["massive_layer_median"] == 1
    assert row["massive_layer_median_channels"] == [7]


def test_scan_no_validate_sets_skips_the_causal_check(tmp_path):
    args = ["scan", "random:llama-tiny", "--n", "2", "--seq-len", "8", "--suite", "natural",
            "--variant", "bos", "--no-report"]
    on = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "on"), "--validate-sets"])
    off = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "off")])  # the default
    assert "add --validate-sets" in off.output and "add --validate-sets" not in on.output
    assert on.exit_code == 0 and off.exit_code == 0, (on.output, off.output)
    with_check = json.loads((tmp_path / "on" / "census.json").read_text())
    without = json.loads((tmp_path / "off" / "census.json").read_text())
    assert "super_neuron_causality" in with_check and "super_neuron_causality" not in without
    assert with_check["runs"] == without["runs"]
# --- memory (issue 27 item 1): the census holds less, every number is the same ------------------


@pytest.mark.parametrize("model_name", ["llama_tiny", "gpt2_tiny"])
def test_census_equals_the_measurements_of_a_plain_full_cache(model_name, request):
    """The census's stacked-once cache, per-layer weights and per-layer reductions change no
    number: every census.json entry equals the same measurement of one plain run_with_cache
    of every hook with the model's stacked weights (W_out, W_O), and the head norms and the
    variance sums equal the all-layers-at-once formulas they replaced."""
    import torch

    from mechsink.measure.registry import CENSUS_MEASUREMENTS, CensusContext
    from mechsink.model import token_strings

    model = request.getfixturevalue(model_name)
    c = census(model, ["natural", "random"], ["bos"], n=4, seq_len=8, batch_size=4, seed=3)
    for run in c.runs:
        tokens = make_prompts(model, run.prompts["suite"], "bos", n=4, seq_len=8, seed=3).tokens
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens)
        w_o = model.W_O.detach()
        context = CensusContext(model.W_out.detach(), w_o, tokens=tokens,
                                decode=lambda ids: token_strings(model, ids))
        for entry in CENSUS_MEASUREMENTS:
            reference = entry.to_json(entry.measure(cache, context))
            assert entry.to_json(run.measurements[entry.name]) == reference, entry.name
        layers = range(model.cfg.n_layers)
        z = torch.stack([cache[f"blocks.{lay}.attn.hook_z"] for lay in layers])
        norms = torch.einsum("lbphd,lhdm->lbphm", z, w_o).norm(dim=-1).mean(dim=2)
        torch.testing.assert_close(run.heads.norms, norms.transpose(0, 1), rtol=1e-6, atol=0)
        out = torch.stack([cache[f"blocks.{lay}.hook_attn_out"] for lay in layers]).double()
        pattern = torch.stack([cache[f"blocks.{lay}.attn.hook_pattern"] for lay in layers])
        torch.testing.assert_close(run.variance.total, out.sum(1), rtol=1e-12, atol=0)
        torch.testing.assert_close(run.variance.total_sq, (out**2).sum(1), rtol=1e-12, atol=0)
        torch.testing.assert_close(run.variance.concentration,
                                   (pattern.double()**2).sum(-1).mean(2).sum(1),
                                   rtol=1e-12, atol=0)
