"""The notebooks in docs/notebooks execute from top to bottom on tiny models (nbclient), with
their parameter cell rewritten the way the docs build does it, and produce their outputs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from docs.build import DOCS, NOTEBOOKS, execute_notebook, notebook_markdown

for _module in ("nbclient", "nbformat", "ipykernel"):
    pytest.importorskip(_module, reason=f"needs {_module}: pip install -e '.[dev]'")

CASES = {
    "sink_census_walkthrough": ({"MODEL": "random:llama-tiny", "N": 2, "SEQ_LEN": 16},
                                ["census-out/census.json", "census-out/attention.html",
                                 "census-out/variance.png"], 5),
    "patching_walkthrough": ({"MODEL": "random:gpt2-tiny"},
                             ["patch-out/resid_pre.json", "patch-out/mlp_out_pos0.json",
                              "patch-out/path_frozen.json"], 2),
    "researcher_tour": ({"MODEL": "random:llama-tiny", "N": 2, "SEQ_LEN": 16},
                        ["tour-out/resid_pre.json", "tour-out/census_heads.html",
                         "tour-out/path_resid1.json"], 3),
}


def test_every_notebook_is_tested() -> None:
    assert sorted(CASES) == sorted(NOTEBOOKS)
    assert sorted(p.stem for p in (DOCS / "notebooks").glob("*.ipynb")) == sorted(NOTEBOOKS)


@pytest.mark.parametrize("name", sorted(CASES))
def test_notebook_runs_on_a_tiny_model(name: str, tmp_path: Path) -> None:
    params, files, n_images = CASES[name]
    nb = execute_notebook(DOCS / "notebooks" / f"{name}.ipynb", params, tmp_path, timeout=300)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert errors == []
    assert all(c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    for f in files:
        assert (tmp_path / f).is_file() and (tmp_path / f).stat().st_size > 0, f
    md = notebook_markdown(nb, tmp_path / "files", "files")
    assert md.count("![output") == n_images
    assert len(list((tmp_path / "files").glob("*.png"))) == n_images
    printed = "".join(o.get("text", "") for o in outputs if o.get("name") == "stdout")
    if name == "sink_census_walkthrough":
        assert "sink rate (Gu)" in printed and "natural/bos" in printed
        assert "external scripts: none" in printed
    elif name == "researcher_tour":
        from mechsink.viz.attention import external_scripts

        assert "Census('random:llama-tiny'" in printed and "PatchResult(" in printed
        assert "corrupted is an ActivationCache" in printed  # the TransformerLens-style call
        html = [_join(o["data"]["text/html"]) for o in outputs if "text/html" in o.get("data", {})]
        views = [h for h in html if "CircuitsVis.render" in h]
        assert len(views) == 2 and all(external_scripts(h) == [] for h in views)
        assert all("mechsink-cv-legend" in h for h in views)  # this checkout's views
        # circuitsvis's 1.3 MB script rides with the first view only (#30 item 6)
        assert [len(h) > 1_000_000 for h in views] == [True, False]
        assert len(views[1]) < 100_000
        assert any("<table" in h and "natural/nobos" in h for h in html)  # census.to_frame()
        assert any("largest effects" in h for h in html)  # PatchResult's card
        # the IOI-style section: per-prompt answers on a padded batch equal a loop over prompts
        line = next(x for x in printed.splitlines() if "a loop over prompts" in x)
        padded, looped = (float(w) for w in re.findall(r"-?\d+\.\d+", line))
        assert abs(padded - looped) <= 1e-3
        assert "LogitDiff(correct=[" in printed and "EffectComparison(" in printed
        assert any("path_rank" in h for h in html)  # the path-vs-direct frame
    else:
        assert "logit diff: clean" in printed and "scales=frozen:" in printed


def test_a_notebook_imports_this_checkouts_mechsink(tmp_path: Path) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    from docs.build import ROOT

    cell = new_code_cell("MODEL = 'x'", metadata={"tags": ["parameters"]})
    nb = new_notebook(cells=[cell, new_code_cell("import mechsink; print(mechsink.__file__)")])
    path = tmp_path / "where.ipynb"
    nbformat.write(nb, path)
    done = execute_notebook(path, {"MODEL": "y"}, tmp_path, timeout=120)
    printed = done.cells[1].outputs[0]["text"].strip()
    assert Path(printed).resolve() == (ROOT / "mechsink" / "__init__.py").resolve()


def _join(text: str | list[str]) -> str:
    return "".join(text) if isinstance(text, list) else text
