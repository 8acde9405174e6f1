"""mechsink sweep: local and Ray runs give byte-identical merged results, a killed sweep resumes
without redoing finished shards, a raising shard is reported, a bad spec is refused by line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mechsink import load_model
from mechsink.app.sweep import ShardWorker, load_spec, run_sweep
from mechsink.errors import BadInputError, MechsinkError
from mechsink.patching.checks import SaturatedMetricWarning
from mechsink.training.loop import Recipe, train

TINY = Recipe("sw-tiny", "gpt2", n_layers=1, d_model=32, n_heads=2, data="bigram-backcopy",
              seq_len=16, batch_size=4, steps=2, lr=1e-2, warmup=1)

SPEC = """\
models = [
  "random:gpt2-tiny",
  "random:llama-tiny",
  {name = "random:gpt2-mini", seed = 3},
]
training_runs = ["run"]
jobs = ["census", "timeline"]

[census]
suites = ["natural", "random"]
variants = ["bos"]
n = 2
seq_len = 16

[timeline]
n = 3
seq_len = 16
seed = 5
"""


def merged_files(out: Path) -> dict[str, bytes]:
    """Every merged file (not the shards, not the summary with its timings, not the result
    sets' manifests with the time they were written)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.parts[len(out.parts)] not in ("shards", "summary.json")
            and p.name != "manifest.json"}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    train(TINY, root / "run", steps=2, progress=False)
    (root / "spec.toml").write_text(SPEC)
    return root


@pytest.fixture(scope="module")
def local_run(sweep_dir) -> tuple[Path, dict]:
    out = sweep_dir / "local"
    return out, run_sweep(sweep_dir / "spec.toml", out)


def test_local_sweep_merges_what_a_direct_measurement_gives(sweep_dir, local_run):
    out, summary = local_run
    checkpoints = json.loads((sweep_dir / "run" / "run.json").read_text())["checkpoints"]
    assert summary["ran"] == 2 * (3 + len(checkpoints)) and summary["failed"] == 0
    census = json.loads((out / "census" / "census.json").read_text())
    labels = [m["model"] for m in census["models"]]
    assert labels == ["random:gpt2-tiny", "random:llama-tiny", "random:gpt2-mini@seed3",
                      *[f"run/step-{s}" for s in checkpoints]]
    # sink rate of one model against TransformerLens's own cache, computed by hand (Gu et al.)
    from mechsink.inputs.prompts import make_prompts
    from mechsink.model import act_name

    model = load_model("random:gpt2-mini", seed=3, device="cpu")
    tokens = make_prompts(model, "natural", "bos", n=2, seq_len=16, seed=0).tokens
    _, cache = model.run_with_cache(tokens)
    pats = torch.stack([cache[act_name("pattern", layer)] for layer in range(model.cfg.n_layers)])
    alpha = pats[..., :, 0].mean(-1)  # layer, batch, head: mean over queries i >= 0 of A[i, 0]
    expected = (alpha > 0.3).float().mean().item()
    row = next(r for r in census["table"]
               if r["model"] == "random:gpt2-mini@seed3" and r["run"] == "natural/bos")
    assert row["sink_rate"] == pytest.approx(expected, abs=1e-6)
    csv_lines = (out / "census" / "census.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 2 * len(labels) and csv_lines[0].startswith("model,run,sink_rate")
    assert (out / "census" / "sink_rate.png").read_bytes()[:4] == b"\x89PNG"
    timeline = json.loads((out / "timeline" / "timeline.json").read_text())["points"]
    steps = [p["step"] for p in timeline if p["model"].startswith("run/")]
    assert steps == checkpoints
    loss = json.loads((sweep_dir / "run" / "run.json").read_text())["losses"][-1]
    assert timeline[-1]["loss"] == loss


@pytest.mark.slow  # ~30 s, most of it starting and stopping Ray on 2 shared cores
def test_ray_with_two_workers_gives_byte_identical_merged_results(sweep_dir, local_run):
    pytest.importorskip("ray")
    out, _ = local_run
    ray_out = sweep_dir / "ray"
    summary = run_sweep(sweep_dir / "spec.toml", ray_out, ray=True, workers=2)
    assert summary["backend"] == "local ray, 2 workers" and summary["failed"] == 0
    assert merged_files(ray_out) == merged_files(out)
    assert len({r["pid"] for r in summary["shards"]}) == 2  # both workers took shards
    # a worker keeps its model: every shard of one model ran in one worker process
    for model in {r["model"] for r in summary["shards"]}:
        assert len({r["pid"] for r in summary["shards"] if r["model"] == model}) == 1


def test_killed_sweep_resumes_without_redoing_finished_shards(sweep_dir, local_run):
    out, full = local_run
    part = sweep_dir / "resumed"
    first = run_sweep(sweep_dir / "spec.toml", part, max_shards=3)  # "killed" after 3 shards
    assert first["ran"] == 3 and first["not_run"] == len(full["shards"]) - 3
    done = {r["id"] for r in first["shards"] if r["status"] == "ran"}
    written = {p.stem: p.stat().st_mtime_ns for p in (part / "shards").glob("*.json")}
    assert set(written) == done
    second = run_sweep(sweep_dir / "spec.toml", part)
    assert {r["id"] for r in second["shards"] if r["status"] == "skipped"} == done
    assert second["ran"] == len(full["shards"]) - 3
    assert all((part / "shards" / f"{i}.json").stat().st_mtime_ns == t for i, t in written.items())
    assert merged_files(part) == merged_files(out)
    # a lost shard file: only that shard runs again
    lost = sorted(written)[0]
    (part / "shards" / f"{lost}.json").unlink()
    third = run_sweep(sweep_dir / "spec.toml", part)
    assert [r["id"] for r in third["shards"] if r["status"] == "ran"] == [lost]
    assert merged_files(part) == merged_files(out)


def test_a_raising_shard_is_reported_and_the_others_finish(tmp_path, monkeypatch):
    from mechsink.app import sweep

    pairs = [{"clean": "The cat sat on the mat", "corrupted": "The dog sat on the mat"},
             {"clean": "The cat sat on the", "corrupted": "The dog sat on the"},
             {"clean": "The cow sat on the mat", "corrupted": "The pig sat on the mat"}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    (tmp_path / "spec.toml").write_text('models = ["random:gpt2-tiny"]\njobs = ["patch"]\n'
                                        '[patch]\npairs = "pairs.jsonl"\nmetric = "kl"\n'
                                        'site = "resid_pre"\npairs_per_shard = 1\n')
    # the spec check refuses what it can see (pairs of different lengths, ...): a failure at
    # run time (a node out of memory, a damaged file) is injected into the second shard
    real = sweep._JOB_RUNNERS["patch"]

    def second_fails(worker, shard):
        if shard["settings"]["first"] == 1:
            raise BadInputError("the second shard's token failure")
        return real(worker, shard)

    monkeypatch.setitem(sweep._JOB_RUNNERS, "patch", second_fails)
    # KL to clean on a tiny random model is near its bound (0): the sweep says so, and runs
    with pytest.warns(SaturatedMetricWarning, match="kl_to_clean"):
        summary = run_sweep(tmp_path / "spec.toml", tmp_path / "out")
    status = [(r["status"], r["error"]) for r in summary["shards"]]
    assert [s for s, _ in status] == ["ran", "failed", "ran"]
    assert "BadInputError" in status[1][1] and "token" in status[1][1]
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["failed"] == 1 and saved["shards"][1]["error"] == status[1][1]
    merged = json.loads((tmp_path / "out" / "patch" / "patch.json").read_text())
    (model,) = merged["models"]
    assert [p["index"] for p in model["pairs"]] == [0, 2]
    # against activation_patch called directly, and the mean taken by hand
    from mechsink.model import to_tokens
    from mechsink.patching import activation_patch, parse_metric

    bridge = load_model("random:gpt2-tiny", device="cpu")
    direct = []
    for k in (0, 2):
        c = to_tokens(bridge, pairs[k]["clean"], prepend_bos=True)
        x = to_tokens(bridge, pairs[k]["corrupted"], prepend_bos=True)
        with pytest.warns(SaturatedMetricWarning):
            direct.append(activation_patch(bridge, c, x, "resid_pre",
                                           parse_metric("kl", bridge, c, x)).values.double())
    assert torch.allclose(torch.tensor(model["pairs"][1]["result"]["values"]).double(),
                          direct[1], atol=1e-6)
    mean = torch.tensor(model["mean_values"], dtype=torch.float64)
    assert torch.allclose(mean, (direct[0] + direct[1]) / 2, atol=1e-6)


@pytest.mark.parametrize("text, line, words", [
    ('models = ["random:gpt2-tiny",\n  "random:gpt9-huge"]\njobs = ["census"]\n', 2, "gpt9"),
    ('models = ["random:gpt2-tiny"]\n\njobs = ["census",\n "scan"]\n', 4, "unknown job"),
    ('models = ["random:gpt2-tiny"]\njobs = ["census"]\n[census]\nn = 2\nsequence = 9\n', 5,
     "unknown setting 'sequence'"),
    ('models = ["random:gpt2-tiny"]\njobs = ["census"]\nworkers = 2\n', 3, "'workers'"),
    ('models = ["random:gpt2-tiny"]\njobs = ["census"]\n[census]\nn = "four"\n', 4, "n must"),
    ('models = ["organism:nowhere"]\njobs = ["census"]\n', 1, "nowhere"),
    ('models = ["random:gpt2-tiny"]\njobs = ["census", "census"]\n', 2, "twice"),
])
def test_bad_spec_is_refused_before_any_work_naming_the_line(tmp_path, text, line, words):
    spec = tmp_path / "spec.toml"
    spec.write_text(text)
    with pytest.raises(BadInputError, match=f"line {line}:.*{words}"):
        run_sweep(spec, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_experiment_setting_is_checked_against_the_experiment(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('models = ["random:gpt2-tiny"]\njobs = ["experiment"]\n[experiment]\n'
                    'name = "structural_origin"\n[experiment.settings]\nn = 4\nsteps = 3\n')
    with pytest.raises(BadInputError, match="line 7:.*no setting 'steps'"):
        load_spec(spec)


def test_ray_worker_fails_clearly_when_a_zoo_model_is_missing_from_its_cache(tmp_path,
                                                                              monkeypatch):
    monkeypatch.setenv("MECHSINK_CACHE", str(tmp_path / "empty-cache"))
    shard = {"id": "x", "job": "census", "threads": 1, "device": "cpu",
             "model": {"label": "smollm2-135m", "load": "smollm2-135m", "seed": None,
                       "meta": {}},
             "settings": {"suites": ["natural"], "variants": ["bos"], "n": 1, "seq_len": 8,
                          "seed": 0, "eps": 0.3, "batch_size": 1}}
    outcome = ShardWorker(remote=True).run(shard)
    assert outcome["status"] == "failed"
    assert "MECHSINK_CACHE" in outcome["error"]
    assert str(tmp_path / "empty-cache") in outcome["error"]


def test_sweep_cli_reports_failures_with_exit_status(tmp_path):
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    (tmp_path / "spec.toml").write_text('models = ["random:nope-tiny"]\njobs = ["census"]\n')
    result = CliRunner().invoke(app, ["sweep", str(tmp_path / "spec.toml"), "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 2 and "line 1" in result.output
    with pytest.raises(MechsinkError):
        load_spec(tmp_path / "missing.toml")
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_experiment_job_saves_what_the_experiment_gives_when_called_directly(tmp_path):
    from mechsink.experiments import get_experiment

    (tmp_path / "spec.toml").write_text(
        'models = ["random:gpt2-tiny"]\njobs = ["experiment"]\n[experiment]\n'
        'name = "structural_origin"\n[experiment.settings]\nn = 2\nseq_len = 16\n'
        'positions = [4, 8]\n')
    summary = run_sweep(tmp_path / "spec.toml", tmp_path / "out")
    assert summary["failed"] == 0
    (entry,) = json.loads((tmp_path / "out" / "experiment" / "experiments.json").read_text()
                          )["results"]
    folder = tmp_path / "out" / "experiment" / entry["folder"]
    saved = json.loads((folder / "result.json").read_text())
    direct = get_experiment("structural_origin").run(
        load_model("random:gpt2-tiny", device="cpu"), model_name="random:gpt2-tiny", n=2,
        seq_len=16, positions=[4, 8]).data
    assert saved == {"experiment": "structural_origin", **json.loads(json.dumps(direct))}
    assert (folder / "summary.md").is_file()


def test_merged_job_folders_are_whole_result_sets(local_run):
    from mechsink.io import check_result_set

    out, _ = local_run
    for job in ("census", "timeline"):
        files = set(check_result_set(out / job, full=True)["files"])
        assert f"{job}.json" in files and f"{job}.csv" in files


# --- sweep outputs keyed by the shard's digest; entries normalised (#29 items 3, 17) ----------


def _organism(sweep_dir: Path, folder: Path) -> Path:
    """A copy of the sweep's trained organism (step 2 of ``run``) at ``folder``."""
    shutil.copytree(sweep_dir / "run" / "step-2", folder)
    return folder


def test_models_whose_labels_slug_alike_get_distinct_experiment_folders(sweep_dir, tmp_path,
                                                                        monkeypatch):
    from mechsink.app import sweep
    from mechsink.experiments import ExperimentResult

    one = _organism(sweep_dir, tmp_path / "a b")
    shutil.copytree(one, tmp_path / "a_b")
    (tmp_path / "spec.toml").write_text(
        'models = ["organism:a b", "organism:a_b"]\njobs = ["experiment"]\n[experiment]\n'
        'name = "gpt2_query_bias"\n[experiment.settings]\nn = 2\ntop = 1\n')
    spec = load_spec(tmp_path / "spec.toml")
    shards = sweep.make_shards(spec)
    out = tmp_path / "out"
    (out / "shards").mkdir(parents=True)
    for k, shard in enumerate(shards):  # finished shards, as a run would leave them
        (out / "shards" / f"{shard['id']}.json").write_text(json.dumps(
            {"shard": shard, "run": {}, "result": {"model": shard["model"]["label"], "k": k}}))
    monkeypatch.setattr(ExperimentResult, "summary", lambda self: f"{self.data['model']}\n")
    monkeypatch.setattr(ExperimentResult, "figure", lambda self, path: None)
    sweep.merge(spec, shards, out)
    index = json.loads((out / "experiment" / "experiments.json").read_text())["results"]
    folders = [e["folder"] for e in index]
    assert len(set(folders)) == 2, folders  # the old slug gave "a_b" for both
    for entry in index:
        saved = json.loads((out / "experiment" / entry["folder"] / "result.json").read_text())
        assert saved["model"] == entry["model"]


@pytest.mark.parametrize("second", ["../org/", "{abs}", "../org/./"])
def test_one_model_spelled_twice_is_a_duplicate(sweep_dir, tmp_path, second):
    _organism(sweep_dir, tmp_path / "org")
    (tmp_path / "specs").mkdir()
    other = second.format(abs=tmp_path / "org")
    (tmp_path / "specs" / "spec.toml").write_text(
        f'models = ["organism:../org", "organism:{other}"]\njobs = ["census"]\n')
    with pytest.raises(BadInputError, match="listed twice"):
        load_spec(tmp_path / "specs" / "spec.toml")


def test_one_training_run_spelled_twice_is_a_duplicate(sweep_dir, tmp_path):
    spec = sweep_dir / "dup.toml"
    spec.write_text(f'training_runs = ["run", "run/", "{sweep_dir / "run"}"]\n'
                    'jobs = ["timeline"]\n')
    with pytest.raises(BadInputError, match="listed twice"):
        load_spec(spec)


# --- non-UTF-8 input, every value checked before any work (#29 items 10, 16, 18) -------------


def test_non_utf8_bytes_in_a_spec_or_a_pairs_file_are_one_line(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_bytes(b'models = ["random:gpt2-tiny"]\njobs = ["census"]\n# caf\xe9\n')
    with pytest.raises(BadInputError, match=r"line 3: byte 0xe9 is not UTF-8"):
        load_spec(spec)
    (tmp_path / "pairs.jsonl").write_bytes(b'{"clean": "a\xff", "corrupted": "b"}\n')
    spec.write_text('models = ["random:gpt2-tiny"]\njobs = ["patch"]\n[patch]\n'
                    'pairs = "pairs.jsonl"\n')
    with pytest.raises(BadInputError, match=r"pairs.jsonl, line 1: byte 0xff is not UTF-8"):
        load_spec(spec)


_GOOD = 'models = ["random:gpt2-tiny"]\n'


@pytest.mark.parametrize("body, line, words", [
    ('jobs = ["census"]\n[census]\nn = 0\n', 4, "n must be a positive integer, got 0"),
    ('jobs = ["census"]\n[census]\nsuites = ["natural", "poems"]\n', 4, "unknown suite 'poems'"),
    ('jobs = ["census"]\n[census]\neps = 5\n', 4, "eps must lie strictly between 0 and 1"),
    ('jobs = ["census"]\n[census]\nseq_len = 100000\n', 4, "longer than the model's context"),
    ('jobs = ["census"]\n[census]\nbatch_size = 0\n', 4, "batch_size must be a positive"),
    ('jobs = ["timeline"]\n[timeline]\nn = -2\n', 4, "n must be a positive integer"),
    ('jobs = ["patch"]\n[patch]\npairs = "p.jsonl"\nsite = "nowhere"\n', 5, "nowhere"),
    ('jobs = ["patch"]\n[patch]\npairs = "p.jsonl"\nmetric = "accuracy"\n', 5, "accuracy"),
    ('jobs = ["patch"]\n[patch]\npairs = "p.jsonl"\ndirection = "up"\n', 5,
     "direction must be denoise or noise"),
    ('jobs = ["patch"]\n[patch]\npairs = "empty.jsonl"\n', 4, "holds no prompt pairs"),
    ('jobs = ["experiment"]\n[experiment]\nname = "structural_origin"\n'
     '[experiment.settings]\nn = -4\n', 6, "structural_origin --n must be at least 1"),
    ('jobs = ["experiment"]\n[experiment]\nname = "structural_origin"\n'
     '[experiment.settings]\nseq_len = 16\n', 6, "--positions"),
])
def test_every_spec_value_is_checked_before_any_model_loads(tmp_path, monkeypatch, body, line,
                                                             words):
    from mechsink.model import zoo

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the spec was checked")

    monkeypatch.setattr(zoo, "load_model", refuse)
    (tmp_path / "p.jsonl").write_text('{"clean": "The cat", "corrupted": "The dog"}\n')
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "spec.toml").write_text(_GOOD + body)
    with pytest.raises(BadInputError, match=f"line {line}:.*{words}"):
        run_sweep(tmp_path / "spec.toml", tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only torch")
def test_a_sweep_on_cuda_without_cuda_is_refused_by_line(tmp_path):
    (tmp_path / "spec.toml").write_text(_GOOD + 'jobs = ["census"]\ndevice = "cuda"\n')
    with pytest.raises(BadInputError, match="line 3:.*no CUDA"):  # device = "cuda" is line 3
        load_spec(tmp_path / "spec.toml")


def test_a_missing_organism_names_the_path_relative_to_the_spec(tmp_path):
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "spec.toml").write_text('models = ["organism:../org9"]\n'
                                                  'jobs = ["census"]\n')
    with pytest.raises(BadInputError) as info:
        load_spec(tmp_path / "specs" / "spec.toml")
    assert str(tmp_path / "specs" / ".." / "org9") in str(info.value)
    assert "bundled" in str(info.value)
