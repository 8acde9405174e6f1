"""The sink atlas end to end on a tiny model: every claim a cell with verdict, criterion and a
link that exists; a rerun with the same settings loads no model."""

from __future__ import annotations

import inspect
import json
import shutil

import pytest

from mechsink.errors import BadInputError
from mechsink.experiments import atlas


def test_models_are_checked_before_any_work(tmp_path):
    with pytest.raises(BadInputError, match="listed twice"):
        atlas.run(work_dir=tmp_path, models=["random:gpt2-tiny", "random:gpt2-tiny"])
    with pytest.raises(BadInputError, match="unknown model"):
        atlas.run(work_dir=tmp_path, models=["gpt-17"])
    with pytest.raises(BadInputError, match="no folder"):
        atlas.run(work_dir=tmp_path, models=["hf:/no/such/folder"])
    with pytest.raises(BadInputError, match="n must be at least 2"):
        atlas.run(work_dir=tmp_path, models=["random:gpt2-tiny"], n=1)
    assert not any(tmp_path.iterdir())


def test_an_atlas_sweep_spec_is_checked_before_any_work(tmp_path):
    from mechsink.app.sweep import load_spec

    spec = tmp_path / "atlas.toml"
    spec.write_text('models = ["random:gpt2-tiny"]\njobs = ["atlas"]\n[atlas]\nn = 1\n')
    with pytest.raises(BadInputError, match="line 4.*n must be at least 2"):
        load_spec(spec)
    spec.write_text('models = [{name = "random:gpt2-tiny", seed = 3}]\njobs = ["atlas"]\n')
    with pytest.raises(BadInputError, match="model names only"):
        load_spec(spec)
    spec.write_text('models = ["smollm2-135m", "random:gpt2-tiny"]\njobs = ["atlas"]\n')
    assert [m.load for m in load_spec(spec).models] == ["smollm2-135m", "random:gpt2-tiny"]
    # the spec shipped in circuits/ is the experiment's own defaults
    from pathlib import Path

    shipped = load_spec(Path(__file__).parents[1] / "circuits" / "atlas.toml")
    assert [m.label for m in shipped.models] == list(atlas.DEFAULT_MODELS)
    params = inspect.signature(atlas.run).parameters
    defaults = {k: params[k].default for k in shipped.settings["atlas"]}
    assert shipped.settings["atlas"] == defaults


def test_slugs_of_distinct_names_never_collide():
    assert atlas._slug("runs/a b") != atlas._slug("runs/a_b")


@pytest.mark.slow
def test_atlas_end_to_end_and_resumed(tmp_path, monkeypatch):
    result = atlas.run(work_dir=tmp_path, models=["organism:bb-gpt2-tiny"], n=3, seq_len=12)
    saved = json.loads((tmp_path / "atlas.json").read_text())
    assert saved["schema"] == atlas.SCHEMA
    row = saved["models"][0]
    assert set(row["cells"]) == set(atlas.CLAIMS)
    for claim, cell in row["cells"].items():
        assert cell["verdict"] and cell["criterion"] and cell["evidence"], claim
        if cell["link"]:
            assert (tmp_path / cell["link"] / "summary.md").is_file(), claim
    # the organism has a query bias: C6 is judged, not "not applicable"; on 3 prompts (fewer
    # than MIN_N_APART) its interval against the threshold is not called
    assert row["cells"]["C6"]["verdict"] == "too few prompts to call"
    assert "n=3" in row["cells"]["C6"]["evidence"]
    assert len(row["first_token"]) == 9
    assert "<table>" in (tmp_path / "atlas.html").read_text()
    assert "| C1 variance discrepancy" in (tmp_path / "summary.md").read_text()

    def no_load(*args, **kwargs):
        raise AssertionError("a rerun with the same settings must not load a model")

    monkeypatch.setattr("mechsink.model.load_model", no_load)
    again = atlas.run(work_dir=tmp_path, models=["organism:bb-gpt2-tiny"], n=3, seq_len=12)
    assert again.data == result.data

    # the same column through `mechsink sweep` (jobs = ["atlas"]): its runs copied beside the
    # sweep's table are read back (still no model load), and every link leads to its run
    from mechsink.app.sweep import ATLAS_RUNS, run_sweep

    out = tmp_path / "sweep"
    shutil.copytree(tmp_path / row["folder"], out / ATLAS_RUNS / row["folder"])
    spec = tmp_path / "atlas.toml"
    spec.write_text('models = ["organism:bb-gpt2-tiny"]\njobs = ["atlas"]\n'
                    "[atlas]\nn = 3\nseq_len = 12\n")
    summary = run_sweep(spec, out)
    assert summary["failed"] == 0 and summary["ran"] == 1
    merged = json.loads((out / "atlas" / "atlas.json").read_text())
    swept = merged["models"][0]
    assert {c: v["verdict"] for c, v in swept["cells"].items()} == {
        c: v["verdict"] for c, v in row["cells"].items()}
    for claim, cell in swept["cells"].items():
        if cell["link"]:
            assert (out / "atlas" / cell["link"] / "summary.md").is_file(), claim
    assert merged["missing"] == [] and "| C1 variance" in (out / "atlas" / "summary.md").read_text()


def test_a_claim_that_did_not_run_links_nothing():
    cell = atlas._cell(None, None, "the model has no query bias (b_Q).")
    assert cell["link"] is None and cell["verdict"] == "not applicable"
    assert cell["evidence"] == "the model has no query bias (b_Q)"


def test_c3_reads_the_most_complete_removal():
    """Where the creating block's set leaves the sink but every building block's sets remove
    it (Gemma 3: block 5 names the channel, blocks 3-11 build it), C3 is judged on the latter,
    and the cell says so; otherwise the creating set's verdict stands."""
    plain = {"verdict": "not supported", "criterion": "c", "evidence": "0.58 -> 0.59"}
    every = {"verdict": "supported", "criterion": "c all", "evidence": "0.66 -> 0.14"}
    cell = atlas._c3_cell({"C3": plain, "C3, every building block": every}, "m/so", None)
    assert cell["verdict"] == "supported" and cell["criterion"] == "c all"
    assert "every building block" in cell["evidence"] and "0.58 -> 0.59" in cell["evidence"]
    kept = atlas._c3_cell({"C3": {**plain, "verdict": "supported"},
                           "C3, every building block": every}, "m/so", None)
    assert kept["verdict"] == "supported" and kept["evidence"] == "0.58 -> 0.59"
    assert atlas._c3_cell({"C3": plain}, None, None)["verdict"] == "not supported"
