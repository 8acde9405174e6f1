"""Sink timeline over checkpoints, and the training-based experiments end to end (tiny)."""

from __future__ import annotations

import json

import torch

from mechsink import load_model
from mechsink.experiments import gpt2_query_bias, headwise_rmsnorm, seedprint
from mechsink.experiments import sink_timeline as sink_timeline_experiment
from mechsink.inputs.tasks import BigramBackcopy
from mechsink.measure import sink_score
from mechsink.measure.timeline import sink_timeline, write_timeline
from mechsink.training.loop import Recipe, train

TINY = Recipe("tl-tiny", "gpt2", n_layers=1, d_model=32, n_heads=2, data="bigram-backcopy",
              seq_len=16, batch_size=4, steps=4, lr=1e-2, warmup=2)


def test_timeline_has_one_point_per_checkpoint_and_matches_direct_measurement(tmp_path):
    out = train(TINY, tmp_path / "run", seed=0, progress=False)
    tokens = BigramBackcopy().batch(99, 0, 6, 16)
    points = sink_timeline(out, tokens)
    assert [p.step for p in points] == [0, 1, 2, 4]
    model = load_model(f"organism:{out / 'step-4'}", device="cpu")
    _, cache = model.run_with_cache(tokens)
    direct = sink_score(cache["blocks.0.attn.hook_pattern"], include_self=False).mean(0).max()
    assert abs(points[-1].max_sink_score - direct.item()) < 1e-6
    assert points[-1].loss == json.loads((out / "run.json").read_text())["losses"][3]
    saved = json.loads(write_timeline(points, tmp_path / "timeline.json").read_text())
    assert saved["schema"] == "mechsink-timeline/1" and len(saved["points"]) == 4
    assert torch.isfinite(torch.tensor([p.first_token_norm_ratio for p in points])).all()


def test_headwise_rmsnorm_runs_end_to_end(tmp_path):
    out = tmp_path / "c8"
    headwise_rmsnorm.run(work_dir=out, steps=3, seeds=[0, 1]).save(out)
    result = json.loads((out / "result.json").read_text())
    assert result["schema"] == "mechsink-c8/1"
    assert set(result["arms"]) == {"bb-gpt2-tiny", "bb-gpt2-tiny+hwrms"}
    assert result["verdict_convergence"].startswith(("supported", "not supported"))
    assert (out / "twins.png").stat().st_size > 10_000
    assert "Verdict" in (out / "summary.md").read_text()


def test_bundled_organism_loads_by_name_and_has_its_sinks():
    from mechsink.measure import sink_scores
    from mechsink.training.loop import task_of

    model = load_model("organism:bb-gpt2-tiny", device="cpu")
    task = task_of("organism:bb-gpt2-tiny")
    assert isinstance(task, BigramBackcopy)
    _, cache = model.run_with_cache(task.batch(10_000, 0, 16, 64))
    scores = sink_scores(cache).no_self.mean(0)
    assert (scores[0] > 0.5).sum() >= 2  # the README's layer-0 sink heads


def test_query_bias_runs_end_to_end(tmp_path):
    out = tmp_path / "c6"
    model = load_model("organism:bb-gpt2-tiny", device="cpu")
    gpt2_query_bias.run(model, model_name="organism:bb-gpt2-tiny", n=4, seq_len=24,
                        top=2).save(out)
    result = json.loads((out / "result.json").read_text())
    assert result["schema"] == "mechsink-c6/2" and len(result["sink_heads"]) == 2
    assert set(result["ablations"]) == {"no query bias", "no key bias", "no query or key bias",
                                        "W_K rotated", "layer-0 MLP at pos 0 mean-ablated"}
    head = result["sink_heads"][0]
    assert set(head["parts_key0_minus_rest"]) == {"content", "query bias", "key bias",
                                                  "both biases"}
    assert head["delta_key0_minus_rest"] == head["parts_key0_minus_rest"]["query bias"]
    assert (out / "ablations.png").is_file() and "verdict" in (out / "summary.md").read_text()


def test_sink_timeline_experiment_runs_end_to_end(tmp_path):
    run = train("bb-gpt2-tiny", tmp_path / "run", steps=2, progress=False)
    out = tmp_path / "timeline"
    sink_timeline_experiment.run(run_dir=run, n=4).save(out)
    saved = json.loads((out / "timeline.json").read_text())
    assert [p["step"] for p in saved["points"]] == [0, 1, 2]
    assert (out / "timeline.png").stat().st_size > 10_000


def test_seedprint_runs_end_to_end(tmp_path):
    out = tmp_path / "c7"
    seedprint.run(work_dir=out, size="tiny", depths=[1], n=8, k=8, steps=2).save(out)
    result = json.loads((out / "result.json").read_text())
    assert len(result["token_preference"]) == 2 * 3  # families x init schemes
    assert len(result["seedprint"]["pairs"]) == 15  # 6 organisms
    assert 0 <= result["seedprint"]["false_positive_rate"] <= 1
