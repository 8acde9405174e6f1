"""The sink atlas end to end on a tiny model: every claim a cell with verdict, criterion and a
link that exists; a rerun with the same settings loads no model."""

from __future__ import annotations

import json

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
    # the organism has a query bias: C6 is judged, not "not applicable"
    assert row["cells"]["C6"]["verdict"] in {"necessary", "dispensable", "undecided"}
    assert len(row["first_token"]) == 9
    assert "<table>" in (tmp_path / "atlas.html").read_text()
    assert "| C1 variance discrepancy" in (tmp_path / "summary.md").read_text()

    def no_load(*args, **kwargs):
        raise AssertionError("a rerun with the same settings must not load a model")

    monkeypatch.setattr("mechsink.model.load_model", no_load)
    again = atlas.run(work_dir=tmp_path, models=["organism:bb-gpt2-tiny"], n=3, seq_len=12)
    assert again.data == result.data


def test_a_claim_that_did_not_run_links_nothing():
    cell = atlas._cell(None, None, "the model has no query bias (b_Q).")
    assert cell["link"] is None and cell["verdict"] == "not applicable"
    assert cell["evidence"] == "the model has no query bias (b_Q)"
