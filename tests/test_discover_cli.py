"""`mechsink discover` and the p0_edges experiment: bad input refused before a model loads,
files written, a saved result re-rendered without a model; on SmolLM2 (slow) the exact edge
patch equals path_patch on a real GQA model with massive activations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mechsink.app.cli import app
from mechsink.experiments import ExperimentResult, get_experiment, p0_edges


@pytest.mark.parametrize("args, message", [
    (["--method", "acdc"], "--method"),
    (["--ablation", "half"], "unknown ablation"),
    (["--curves", "zero,nope"], "unknown ablation"),
    (["--ig", "weights"], "--ig"),
    (["--metric", "sink_score:x"], "integers"),
    (["--positions", "a"], "--positions"),
])
def test_discover_refuses_bad_options_before_loading(tmp_path: Path, args, message) -> None:
    base = {"--metric": "sink_score:1", "--out": str(tmp_path / "o")}
    for k, v in zip(args[::2], args[1::2], strict=True):
        base[k] = v
    flat = [x for kv in base.items() for x in kv]
    result = CliRunner().invoke(app, ["discover", "no-such-model", *flat])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "o" / "discover.json").exists()


def test_discover_command_writes_its_files(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "discover", "random:llama-tiny", "--metric", "massive_value:1:0:3", "--method", "eap",
        "--n", "2", "--seq-len", "6", "--verify", "3", "--curves", "zero", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "discover.json").read_text())
    assert data["method"] == "eap" and data["corruption"] == "position_mean"
    assert [c["ablation"] for c in data["curves"]] == ["position_mean", "zero"]
    assert len(data["scores"]["checks"]) == 3
    assert data["scores"]["settings"]["positions"] == [0]
    assert (out / "circuit.png").stat().st_size > 5_000
    assert (out / "faithfulness.png").stat().st_size > 5_000


def test_p0_edges_end_to_end_and_rerendered_from_json(llama_tiny, tmp_path: Path) -> None:
    assert "model_name" in get_experiment("p0_edges").settings()
    result = p0_edges.run(llama_tiny, n=2, seq_len=6, steps=1, verify=3, n_random=1)
    data = result.data
    labels = {(c["label"], c["ablation"]) for c in data["curves"]}
    assert labels == {("edges (eap-ig)", "position_mean"), ("greedy node circuit",
                                                            "position_mean"),
                      ("edges (eap-ig)", "zero"), ("greedy node circuit", "zero")}
    node = next(c for c in data["curves"] if c["label"] == "greedy node circuit")
    # the node curve runs from the empty circuit (0) to the full graph (1)
    assert node["sizes"][0] == 0 and node["sizes"][-1] == data["graph"]["n_edges"]
    assert node["values"][0] == pytest.approx(0.0, abs=1e-6)
    assert node["values"][-1] == pytest.approx(1.0, abs=1e-6)
    assert len(data["checks"]) == 3 and data["settings"]["positions"] == [0]
    out = result.save(tmp_path / "p0")
    assert (out / p0_edges.FIGURE).stat().st_size > 5_000
    assert (out / "p0_edges_circuit.png").exists()
    again = ExperimentResult.load(out, "p0_edges")
    assert again.summary() == (out / "summary.md").read_text()
    assert "greedy node circuit" in again.summary()


@pytest.mark.slow
def test_exact_edge_patch_equals_path_patch_on_smollm2(smollm2) -> None:
    from mechsink.discover import GraphRun
    from mechsink.patching import SinkScore

    g = torch.Generator().manual_seed(0)
    clean = torch.randint(100, 5000, (2, 8), generator=g)
    clean[:, 0] = 1
    run = GraphRun(smollm2, clean, SinkScore(3), ablation="position_mean", positions=[0])
    names = ["L0H3->L2KV1.k", "MLP0->L2H4.q", "L1H0->L2KV2.v", "MLP1->metric", "embed->MLP2"]
    _assert_exact_edges_match_path_patch(smollm2, run, clean, names, abs_tol=1e-5)


@pytest.mark.slow
def test_gemma_head_writes_add_up_and_exact_edges_match_path_patch() -> None:
    """Gemma normalises the attention output after the heads (sandwich norms): the heads'
    writes (each scaled by the run's norm scale) add up to the block's write, and edges out of
    the embedding and MLPs equal path_patch."""
    from mechsink import load_model
    from mechsink.discover import GraphRun, graph_mode
    from mechsink.model import act_name
    from mechsink.patching import SinkScore

    model = load_model("gemma3-270m", device="cpu")
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1000, 20000, (2, 8), generator=g)
    clean[:, 0] = 2
    run = GraphRun(model, clean, SinkScore(3), ablation="position_mean", positions=[0])
    assert run.post_norm
    with torch.no_grad(), graph_mode(model):
        _, cache = model.run_with_cache(clean)
    for layer in range(3):
        total = run.head_writes(dict(cache.cache_dict), layer).sum(2)
        ref = cache[act_name("attn_out", layer)]
        assert (total - ref).abs().max() <= 1e-3 * ref.abs().max()
    names = ["embed->L1H2.q", "MLP0->L2KV0.k", "MLP1->metric", "embed->MLP2"]
    _assert_exact_edges_match_path_patch(model, run, clean, names, abs_tol=1e-4)


def _assert_exact_edges_match_path_patch(model, run, clean, names, *, abs_tol: float) -> None:
    """Each named edge's exact score equals path_patch of its sender (@0, position-mean
    ablated) into its receiver, minus the clean value."""
    from mechsink.discover import exact_scores
    from mechsink.patching import SinkScore, path_patch

    edges = [run.graph.edge_index(n) for n in names]
    ours = exact_scores(run, edges=edges).values
    for e in edges:
        s, r = run.graph.path_spec(e)
        pp = path_patch(model, clean, None, [s + "@0"], [r], SinkScore(3),
                        ablation="position_mean", batch_size=1, prepend_bos=False)
        assert float(ours[e]) == pytest.approx(float(pp.values[0]) - pp.clean_value,
                                               abs=abs_tol)


def test_discover_has_its_own_seed(monkeypatch, tmp_path: Path) -> None:
    """--seed seeds a random:... model; the discovery (resample ablation, random baselines)
    takes --discovery-seed (before, the model's seed was reused)."""
    import mechsink.discover

    seen = []

    def fake(*args, **kw):
        seen.append(kw["seed"])
        raise mechsink.errors.BadInputError("stop here")

    monkeypatch.setattr(mechsink.discover, "discover", fake)
    base = ["discover", "random:llama-tiny", "--metric", "massive_value:1:0:3", "--n", "1",
            "--seq-len", "4", "--out", str(tmp_path / "o")]
    for extra, expected in (([], 0), (["--seed", "5"], 0), (["--seed", "5",
                                                              "--discovery-seed", "7"], 7)):
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 2 and "stop here" in result.output, result.output
        assert seen[-1] == expected


@pytest.mark.parametrize("args, message", [
    (["--target", "nan"], "--target"),
    (["--target", "2"], "--target"),
    (["--target", "-1"], "--target"),
    (["--edges", "-3"], "--edges"),
    (["--clean", ""], "--clean prompt 1 is empty"),
])
def test_discover_refuses_bad_selection_and_empty_prompts_before_loading(
        tmp_path: Path, args, message) -> None:
    """#29 items 15 and 18: --target NaN/2/-1, a negative --edges and an empty --clean."""
    result = CliRunner().invoke(app, ["discover", "no-such-model", "--metric", "sink_score:1",
                                      "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "position_mean" not in result.output
    assert not (tmp_path / "o" / "discover.json").exists()


def test_discover_refuses_too_many_edges_before_scoring(monkeypatch, tmp_path: Path) -> None:
    """#29 item 15: --edges beyond the graph's size is refused before any edge is scored,
    and the message names --edges."""
    import mechsink.discover.pipeline as pipeline

    def never(*args, **kwargs):
        raise AssertionError("scored before the selection was checked")

    monkeypatch.setattr(pipeline, "score_edges", never)
    result = CliRunner().invoke(app, [
        "discover", "random:llama-tiny", "--metric", "massive_value:1:0:3", "--method", "eap",
        "--n", "2", "--seq-len", "6", "--edges", "100000", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--edges" in result.output, result.output
    assert "(the graph's edges)" in result.output
    assert not (tmp_path / "o" / "discover.json").exists()


def test_discover_ig_takes_exactly_the_library_paths(tmp_path: Path) -> None:
    """--ig accepts every path eap_ig(ig=...) takes (coefficients was refused before) and
    refuses anything else in one line naming them all, before a model loads."""
    from mechsink.discover.methods.eap_ig import PATHS

    assert "coefficients" in PATHS
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "discover", "random:llama-tiny", "--metric", "massive_value:1:0:3", "--method", "eap-ig",
        "--ig", "coefficients", "--steps", "1", "--n", "2", "--seq-len", "6", "--verify", "0",
        "--edges", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "discover.json").read_text())
    assert data["method"] == "eap-ig" and data["scores"]["settings"]["ig"] == "coefficients"

    bad = CliRunner().invoke(app, ["discover", "no-such-model", "--metric", "sink_score:1",
                                   "--ig", "weights", "--out", str(tmp_path / "o")])
    lines = bad.output.strip().splitlines()
    assert bad.exit_code == 2 and len(lines) == 1, bad.output
    assert "--ig" in lines[0] and "'weights'" in lines[0]
    assert all(p in lines[0] for p in PATHS), lines[0]
    assert not (tmp_path / "o").exists()

    helped = CliRunner().invoke(app, ["discover", "--help"], env={"COLUMNS": "200"})
    assert all(p in helped.output for p in PATHS)  # the help names every path
