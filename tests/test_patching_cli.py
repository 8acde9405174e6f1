"""The `mechsink patch` command writes the result JSON and the heatmap, and reports bad input."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from mechsink.app.cli import app


def test_patch_command_writes_json_and_figure(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "patch", "random:gpt2-tiny", "--clean", "When Mary and John went",
        "--corrupted", "When Tom and John went", "--site", "z", "--metric", "sink_score:1",
        "--out", str(out), "--device", "cpu",
    ])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "patch.json").read_text())
    assert data["schema"] == "mechsink-patch/1" and data["axes"] == ["layer", "pos", "head"]
    assert (out / "patch.png").stat().st_size > 0


def test_patch_command_bad_site(tmp_path):
    result = CliRunner().invoke(app, [
        "patch", "random:gpt2-tiny", "--clean", "When Mary and John went",
        "--corrupted", "When Tom and John went", "--site", "nonsense", "--metric", "kl",
        "--out", str(tmp_path), "--device", "cpu",
    ])
    assert result.exit_code == 2 and "unknown site" in result.output


def test_patch_command_parses_the_metric_once_and_runs_no_forward_for_it(tmp_path,
                                                                         monkeypatch):
    """`mechsink patch --metric logit_diff` parses the string once (where the command
    checks it) and takes the predicted tokens from the runs patching records: the forwards
    of `--metric logit_diff:A:B` with those tokens, and the same values."""
    import torch

    from mechsink import patching
    from mechsink.model import to_tokens, zoo
    from mechsink.patching import metrics

    clean, corrupted = "The cat sat on the mat", "The dog ran to the car"
    calls = {"forward": 0, "parse": 0}
    real_load, real_parse = zoo.load_model, metrics.parse_metric
    model = real_load("random:gpt2-tiny", device="cpu", seed=0)
    with torch.no_grad():
        a, b = (int(model(to_tokens(model, t, prepend_bos=True))[0, -1].argmax())
                for t in (clean, corrupted))
    assert a != b

    def counted_load(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        loaded.blocks[0].register_forward_pre_hook(
            lambda *_: calls.__setitem__("forward", calls["forward"] + 1))
        return loaded

    def counted_parse(*args, **kwargs):
        calls["parse"] += 1
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(zoo, "load_model", counted_load)
    monkeypatch.setattr(metrics, "parse_metric", counted_parse)
    monkeypatch.setattr(patching, "parse_metric", counted_parse)
    runs = []
    for metric in ("logit_diff", f"logit_diff:{a}:{b}"):
        calls.update(forward=0, parse=0)
        out = tmp_path / metric.replace(":", "-")
        result = CliRunner().invoke(app, [
            "patch", "random:gpt2-tiny", "--clean", clean, "--corrupted", corrupted,
            "--metric", metric, "--out", str(out), "--device", "cpu", "--seed", "0"])
        assert result.exit_code == 0, result.output
        runs.append((json.loads((out / "patch.json").read_text()), dict(calls)))
    (bare, on_bare), (explicit, on_explicit) = runs
    assert on_bare["parse"] == on_explicit["parse"] == 1
    assert on_bare["forward"] == on_explicit["forward"] > 0
    assert bare["values"] == explicit["values"]
    assert (bare["clean_value"], bare["corrupted_value"]) == (explicit["clean_value"],
                                                              explicit["corrupted_value"])
