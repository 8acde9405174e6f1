"""Committed results (docs/results): importing a finished atlas (JSON only, with its
provenance), refusing what is not one, refusing a committed atlas of other settings or edited
files, and the pages it feeds (home table, finding sections, cross-model page) drawn from the
JSON without a model. The atlas here is a real run on two tiny models."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from docs.build import atlas_pages, results  # noqa: E402
from docs.build.findings import plain  # noqa: E402

TINY = {"models": ["organism:bb-gpt2-tiny", "random:llama-tiny"], "n": 2, "seq_len": 8,
        "seed": 0, "eps": 0.3}


@pytest.fixture(scope="module")
def atlas_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mechsink.experiments.atlas import run

    out = tmp_path_factory.mktemp("atlas") / "run"
    run(work_dir=out, **TINY)
    return out


@pytest.fixture
def committed(atlas_run: Path, tmp_path: Path) -> Path:
    root = tmp_path / "results"
    results.import_atlas(atlas_run, root=root, commit="0" * 40)
    return root


def test_import_copies_json_only_with_the_command_settings_commit_and_date(
        atlas_run: Path, committed: Path) -> None:
    entry = results.read_manifest(committed)["results"]["atlas"]
    copied = sorted(p.relative_to(committed / "atlas").as_posix()
                    for p in (committed / "atlas").rglob("*") if p.is_file())
    assert copied == sorted(entry["files"]) and all(p.endswith(".json") for p in copied)
    source = json.loads((atlas_run / "manifest.json").read_text())
    assert entry["command"] == results.relative_command(source["command"], atlas_run)
    assert entry["made"] == source["written"] and entry["imported_from"] == atlas_run.name
    assert str(atlas_run) not in entry["command"]  # no path of the machine that made it
    assert entry["settings"]["models"] == TINY["models"]
    assert {k: entry["settings"][k] for k in ("n", "seq_len", "seed", "eps")} == {
        k: TINY[k] for k in ("n", "seq_len", "seed", "eps")}
    assert entry["mechsink_commit"] == "0" * 40 and entry["commit_source"] == "given at import"
    steps = {f.rsplit("/", 1)[0] for f in entry["files"] if f.endswith("/result.json")}
    assert set(entry["steps_written"]) == steps and all(entry["steps_written"].values())
    data = json.loads((atlas_run / "atlas.json").read_text())
    for row in data["models"]:  # every step the atlas linked came along
        for cell in row["cells"].values():
            if cell["link"]:
                assert (committed / "atlas" / cell["link"] / "result.json").read_bytes() == (
                    atlas_run / cell["link"] / "result.json").read_bytes()


def test_import_refuses_what_is_not_a_finished_atlas(atlas_run: Path, tmp_path: Path) -> None:
    from mechsink.errors import BadInputError

    root = tmp_path / "results"
    with pytest.raises(BadInputError, match="not a folder"):
        results.import_atlas(tmp_path / "nothing", root=root)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BadInputError, match="no atlas.json"):
        results.import_atlas(empty, root=root)
    running = tmp_path / "running"
    shutil.copytree(atlas_run, running)
    (running / ".mechsink.lock").write_text(json.dumps({"pid": os.getpid(), "command": "x"}))
    with pytest.raises(BadInputError, match="still being written"):
        results.import_atlas(running, root=root)
    cut = tmp_path / "cut"
    shutil.copytree(atlas_run, cut)
    step = next(cut.glob("organism*/structural_origin/result.json"))
    step.write_text(step.read_text()[:-10])
    with pytest.raises(BadInputError, match="structural_origin step .* not finished"):
        results.import_atlas(cut, root=root)
    assert not root.exists()  # nothing copied


def test_a_committed_atlas_of_other_settings_or_edited_files_is_refused(committed: Path) -> None:
    assert results.load_atlas(TINY, root=committed) is not None
    with pytest.raises(results.RefusedError, match=r"n: committed 2, the site asks 4.*--rerun "
                                                   r"atlas"):
        results.load_atlas({**TINY, "n": 4}, root=committed)
    with pytest.raises(results.RefusedError, match="models"):
        results.load_atlas({**TINY, "models": ["smollm2-135m"]}, root=committed)
    target = committed / "atlas" / "atlas.json"
    target.write_text(target.read_text().replace('"supported"', '"SUPPORTED"', 1))
    with pytest.raises(results.RefusedError, match="differs from"):
        results.load_atlas(TINY, root=committed)
    assert results.load_atlas(TINY, root=committed.parent / "none") is None


def test_key_figure_keeps_the_interval_the_evidence_gives() -> None:
    long = ("late-layer sink score 0.322 [0.3, 0.343] clean -> 0.279 [0.265, 0.294] removed; "
            "sink rate 0.625 [0.625, 0.625] clean -> 0.5 [0.5, 0.5] removed")
    assert atlas_pages.key_figure(long) == long.split("; ")[0]
    moved = ("0 of 9 (k, intervention) pairs moved the sink, 0 at least doubled the sink at k; "
             "strongest: k=4 (channel planted) sink at k 0.055 -> 0.057, at 0 0.474 -> 0.473")
    assert atlas_pages.key_figure(moved).startswith("strongest: k=4")
    assert atlas_pages.key_figure("bos: 0.500; nobos: 0.125") == "bos: 0.500; nobos: 0.125"


def test_the_home_table_has_every_cell_with_its_verdict_number_and_link(committed: Path) -> None:
    atlas = results.load_atlas(TINY, root=committed)
    md = atlas_pages.home_section(atlas)
    rows = {line.split(" ", 2)[1]: line for line in md.splitlines()
            if line.startswith("| [C")}
    assert sorted(rows) == [f"[C{i}](#atlas-c{i})" for i in range(1, 8)]
    for row in atlas.data["models"]:
        for claim, cell in row["cells"].items():
            line = rows[f"[{claim}](#atlas-{claim.lower()})"]
            assert f"**{cell['verdict']}**" in line
            numbers = re.findall(atlas_pages.INTERVAL, cell["evidence"])
            if numbers:  # the key number and its interval, as the experiment wrote them
                assert plain(numbers[0]) in line
            if cell["link"] and claim != "C7":
                page = "query-bias-dose" if claim == "C6" else (
                    "p0-circuit" if claim == "C5" else "chain")
                assert f"(findings/{page}.md#{atlas_pages.anchor(row['model'])})" in line
    assert "not applicable" in rows["[C6](#atlas-c6)"]  # random:llama-tiny has no b_Q
    for claim in atlas.data["claims"]:  # every row's criterion, listed under the table
        criterion = next(m["cells"][claim]["criterion"] for m in atlas.data["models"]
                         if m["cells"][claim]["criterion"] != "-")
        shown = plain(criterion)  # as text, not markup
        assert f"- **{claim}** ({atlas.data['claims'][claim]}): {shown}." in md
    assert atlas.entry["command"] in md and "0000000000" in md
    evidence = atlas_pages.evidence_section(atlas)
    for claim in atlas.data["claims"]:
        assert f"{{ #atlas-{claim.lower()} }}" in evidence  # the table's row links land
    for row in atlas.data["models"]:
        for cell in row["cells"].values():
            assert f"Measured: {plain(cell['evidence'])}." in evidence


def test_cross_model_page_reads_the_atlas_first_token_table(committed: Path) -> None:
    atlas = results.load_atlas(TINY, root=committed)
    md = atlas_pages.cross_model_section(atlas)
    for row in atlas.data["models"]:
        v = row["first_token"]["random/nobos"]
        assert f"{v['mean']:.3f} [{v['low']:.3f}, {v['high']:.3f}]" in md
    assert md.count("Table: sink rate at key 0 on") == 3


def test_finding_sections_are_drawn_from_the_committed_json_without_a_model(
        committed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mechsink.model.zoo as zoo
    from docs.build.pages import Site, write_atlas_findings
    from docs.build.plan import QUICK

    monkeypatch.setattr(zoo, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    atlas = results.load_atlas(TINY, root=committed)
    site = Site(QUICK, {}, {}, {}, {}, {}, None, {}, atlas)
    (tmp_path / "findings").mkdir()
    done = write_atlas_findings(site, tmp_path)
    assert [f.slug for f, _, _ in done] == ["chain", "p0-circuit", "query-bias-dose"]
    chain = (tmp_path / "findings" / "chain.md").read_text()
    side = chain[chain.index("Table: every model's verdicts side by side"):chain.index("## `")]
    assert "| C1 |" in side and " / " not in side  # nested verdicts stay in the sections
    for row in atlas.data["models"]:
        assert f"{{ #{atlas_pages.anchor(row['model'])} }}" in chain
        png = (tmp_path / "assets" / "results" / "atlas" / row["folder"] / "structural_origin"
               / "structural_origin.png")
        assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    qb = (tmp_path / "findings" / "query-bias-dose.md").read_text()
    assert "organism" in qb and "{ #model-random-llama-tiny }" not in qb  # only with b_Q
    assert "Not on this page: `random:llama-tiny` (the model has no query bias (b_Q))" in qb
    assert site.committed_pages() == {"index.md", "findings/cross-model.md", "findings/chain.md",
                                      "findings/p0-circuit.md", "findings/query-bias-dose.md"}


def test_relative_command_names_the_output_folder_by_its_own_name(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "atlas-n32"
    command = f"mechsink experiment atlas --out {run} --n 32"
    assert (results.relative_command(command, run)
            == "mechsink experiment atlas --out atlas-n32 --n 32")
    assert results.relative_command(None, run) is None
    for program in ("/home/x/.venv/bin/mechsink", ".venv/bin/mechsink"):  # the program by name
        assert (results.relative_command(f"{program} experiment atlas --out {run}", run)
                == "mechsink experiment atlas --out atlas-n32")


def test_a_grid_cell_holds_one_key_number_with_its_interval() -> None:
    moved = ("0 of 9 (k, intervention) pairs moved the sink, 0 at least doubled the sink at k; "
             "strongest: k=4 (channel planted) sink at k 0.055 -> 0.057, at 0 0.474 -> 0.473")
    assert atlas_pages.grid_number(moved) == "sink at k 0.055 → 0.057"
    removed = ("late-layer sink score 0.322 [0.3, 0.343] clean -> 0.279 [0.265, 0.294] removed; "
               "sink rate 0.625 [0.625, 0.625] clean -> 0.5 [0.5, 0.5] removed")
    assert atlas_pages.grid_number(removed) == "late-layer sink score 0.322 [0.3, 0.343] → 0.279"
    dosed = "clean 0.480 [0.376, 0.543], removed 0.295 [0.245, 0.330], threshold 0.240"
    assert atlas_pages.grid_number(dosed) == "clean 0.480 [0.376, 0.543]"
    assert atlas_pages.grid_number("ratio 6.44 (uniform-mixing prediction 7.42); median 0.00"
                                   ) == "ratio 6.44; median 0.00"


def test_an_import_at_new_settings_keeps_the_replaced_verdicts_and_the_page_lists_changes(
        atlas_run: Path, tmp_path: Path) -> None:
    """The committed atlas is made to look like one of other settings with one other verdict;
    importing the run over it keeps its verdicts (previous.json, in the manifest), the page
    lists exactly that cell with both evidences, and a rerun at the same settings carries the
    record on instead of comparing with itself."""
    root = tmp_path / "results"
    results.import_atlas(atlas_run, root=root, commit="0" * 40)
    assert not (root / "atlas" / results.PREVIOUS_FILE).exists()  # nothing before it
    path = root / "atlas" / "atlas.json"
    old = json.loads(path.read_text())
    old["settings"]["n"] = 4
    row = old["models"][0]
    was = row["cells"]["C1"]["verdict"]
    row["cells"]["C1"]["verdict"] = "supported" if was != "supported" else "not supported"
    row["cells"]["C1"]["evidence"] = "ratio 9.99 (the earlier run)"
    gone = {**row, "model": "qwen-gone", "folder": "qwen-gone-0"}
    old["models"].append(gone)  # a model the new atlas does not hold
    path.write_text(json.dumps(old))
    results.import_atlas(atlas_run, root=root, commit="1" * 40)
    entry = results.read_manifest(root)["results"]["atlas"]
    assert results.PREVIOUS_FILE in entry["files"]
    atlas = results.load_atlas(TINY, root=root)
    assert atlas.previous["settings"]["n"] == 4
    moved = atlas_pages.changes(atlas)
    assert [(c["claim"], c["model"]) for c in moved] == [("C1", row["model"])]
    assert moved[0]["before"] == row["cells"]["C1"]["verdict"] and moved[0]["now"] == was
    expected = "gone" if was == "not supported" else "new" if was == "supported" else None
    if expected:
        assert moved[0]["move"] == expected
    page = atlas_pages.changes_section(atlas)
    assert "{ #atlas-changes }" in page and "ratio 9.99" in page and "n = 4 prompts" in page
    assert "`qwen-gone` is not in this atlas" in page and "qwen-gone`  |" not in page
    assert moved[0]["why"] == "the same criterion at n 4 → 2"
    assert "(#atlas-changes)" in atlas_pages.home_section(atlas)
    results.import_atlas(atlas_run, root=root, commit="2" * 40)  # same settings: carried on
    again = results.load_atlas(TINY, root=root)
    assert again.previous == atlas.previous


def test_markup_in_an_imported_atlas_is_shown_not_run(atlas_run: Path, tmp_path: Path) -> None:
    """An atlas folder may come from anyone: a verdict, criterion or evidence holding HTML is
    escaped on the home grid, in the evidence section and in the changes table."""
    run = tmp_path / "received"
    shutil.copytree(atlas_run, run)
    data = json.loads((run / "atlas.json").read_text())
    cell = data["models"][0]["cells"]["C1"]
    cell["verdict"] = "<img src=x onerror=alert(1)>"
    cell["criterion"] = "<script>alert(2)</script>"
    cell["evidence"] = "ratio 1.0 <script>alert(3)</script>"
    body = json.dumps(data).encode()
    (run / "atlas.json").write_bytes(body)
    manifest = json.loads((run / "manifest.json").read_text())  # a well-formed hostile folder
    manifest["files"]["atlas.json"] = {"bytes": len(body),
                                       "sha256": hashlib.sha256(body).hexdigest()}
    (run / "manifest.json").write_text(json.dumps(manifest))
    root = tmp_path / "results"
    results.import_atlas(run, root=root, commit="0" * 40)
    before = {"verdict": "supported", "criterion": "c", "evidence": "<b onclick=x>1</b>"}
    (root / "atlas" / results.PREVIOUS_FILE).write_text(json.dumps({
        "settings": {**data["settings"], "n": 99}, "made": "x",
        "cells": {data["models"][0]["model"]: {"C1": before}}}))
    atlas = results.load_atlas(TINY, root=root)
    assert atlas_pages.changes(atlas)  # the changed cell is on the page
    pages = (atlas_pages.home_section(atlas) + atlas_pages.evidence_section(atlas)
             + atlas_pages.changes_section(atlas))
    assert "<script" not in pages and "<img" not in pages and "<b " not in pages
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in pages and "&lt;img src=x" in pages
    link = "see [here](javascript:alert(4)) { onclick=x }"
    assert plain(link) == r"see \[here\](javascript:alert(4)) \{ onclick=x \}"  # no link


def test_a_model_traced_without_bos_is_named_and_its_changes_say_so(tmp_path: Path) -> None:
    """Where a model has no sink behind BOS its steps trace another first token: the home page
    names it with its first-token rates, and a moved C2-C6 verdict says so in *why*."""
    step = tmp_path / "atlas" / "q-0" / "structural_origin"
    step.mkdir(parents=True)
    (step / "result.json").write_text(json.dumps({"traced_variant": "nobos"}))
    cell = {"verdict": "supported", "criterion": "c", "evidence": "x 1 -> 0", "link": None}
    row = {"model": "q", "folder": "q-0", "cells": {"C1": cell, "C3": cell},
           "first_token": {"natural/bos": {"mean": 0.02}, "natural/nobos": {"mean": 0.557}}}
    settings = {"n": 16, "seq_len": 64, "seed": 0, "eps": 0.3}
    atlas = results.CommittedAtlas(tmp_path / "atlas", "atlas", {
        "models": [row], "claims": {"C1": "one", "C3": "three"}, "settings": settings}, {})
    assert atlas_pages.traced_variant(atlas, row) == "nobos"
    assert atlas_pages.traced_note(atlas) == (
        "C2-C6 trace the sink with BOS first, except where a model has no sink behind BOS: "
        "`q` on nobos (natural-text sink rate at key 0: bos 0.020, nobos 0.557).")
    before = {**cell, "verdict": "not supported"}
    (tmp_path / "atlas" / results.PREVIOUS_FILE).write_text(json.dumps({
        "settings": {**settings, "n": 4}, "made": "x", "cells": {"q": {"C1": before,
                                                                     "C3": before}}}))
    why = {c["claim"]: c["why"] for c in atlas_pages.changes(atlas)}
    assert why == {"C1": "the same criterion at n 4 → 16",
                   "C3": "traced on nobos (no sink behind BOS), at n 4 → 16"}
    (tmp_path / "atlas" / results.PREVIOUS_FILE).write_text(json.dumps({
        "settings": {**settings, "n": 4}, "made": "x",
        "cells": {"q": {c: {**before, "criterion": "older"} for c in ("C1", "C3")}}}))
    why = {c["claim"]: c["why"] for c in atlas_pages.changes(atlas)}
    assert why == {"C1": "the criterion changed",
                   "C3": "the criterion changed; traced on nobos (no sink behind BOS)"}
    plain_row = {**row, "model": "b", "folder": "b-0"}  # no step folder: traced with BOS
    assert atlas_pages.traced_variant(atlas, plain_row) == "bos"
