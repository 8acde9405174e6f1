"""Notebook displays: short reprs and HTML cards, census.to_frame, PatchResult.normalized,
heatmap(raw=True) and its titles, inline attention views, and the progress-bar switch."""

from __future__ import annotations

import inspect
import json
import os

import pytest
import torch

import mechsink.viz
from mechsink import progress
from mechsink.errors import BadInputError
from mechsink.experiments.result import ExperimentResult
from mechsink.inputs.prompts import make_prompts
from mechsink.measure.census import census
from mechsink.model import act_name, to_tokens
from mechsink.patching import activation_patch
from mechsink.viz.attention import external_scripts

CLEAN = "When Mary and John went"
CORRUPTED = "When Tom and John went"


def logit_metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[0, -1, 100] - logits[0, -1, 200]


@pytest.fixture(scope="module")
def tiny_census(llama_tiny):
    return census(llama_tiny, ["random"], ["bos", "nobos"], n=3, seq_len=8, batch_size=2,
                  seed=1)


def test_census_repr_is_short_and_to_frame_matches_a_hand_computation(llama_tiny, tiny_census):
    text = repr(tiny_census)
    assert text.count("\n") == 0 and len(text) < 300 and "random/bos" in text
    assert "tensor" not in repr(tiny_census.runs[0]) and len(repr(tiny_census.runs[0])) < 200
    frame = tiny_census.to_frame()
    assert list(frame["run"]) == ["random/bos", "random/nobos"]
    for variant, row in zip(("bos", "nobos"), frame.itertuples(), strict=True):
        tokens = make_prompts(llama_tiny, "random", variant, n=3, seq_len=8, seed=1).tokens
        with torch.no_grad():
            _, cache = llama_tiny.run_with_cache(tokens)
        # Gu et al.'s sink score by hand: mean attention on key 0 over all queries, per head
        scores = torch.stack([cache[act_name("pattern", lay)][..., :, 0].mean(-1)
                              for lay in range(llama_tiny.cfg.n_layers)], 1)
        expected = (scores > tiny_census.settings["eps"]).double().mean().item()
        assert row.sink_rate == pytest.approx(expected, abs=1e-4)
        best = scores.mean(0).flatten().argmax().item()
        layer, head = divmod(best, llama_tiny.cfg.n_heads)
        assert row.top_sink_head == f"L{layer}H{head}"
    page = tiny_census._repr_html_()
    assert "<table" in page and "random/nobos" in page and len(page) < 20_000


def test_patch_result_normalized_equals_a_normalised_rerun(gpt2_tiny):
    clean = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(gpt2_tiny, CORRUPTED, prepend_bos=True)
    raw = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", logit_metric)
    rerun = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", logit_metric,
                             normalize=True)
    with torch.no_grad():  # the baselines by hand
        a = float(logit_metric(gpt2_tiny(clean)))
        b = float(logit_metric(gpt2_tiny(corrupted)))
    norm = raw.normalized()
    assert norm.is_normalized and not raw.is_normalized
    assert torch.allclose(norm.values, (raw.values - b) / (a - b), atol=1e-5)
    assert torch.allclose(norm.values, rerun.values, atol=1e-6)
    assert norm.normalized() is norm
    text = repr(raw)
    assert "\n" not in text and "resid_pre" in text and "denoise" in text and len(text) < 300
    card = raw._repr_html_()
    assert "<table" in card and "resid_pre" in card
    top = raw.top(3)
    effects = (raw.values - b).abs().flatten().sort(descending=True).values[:3]
    assert [abs(r["effect"]) for r in top] == pytest.approx(effects.tolist(), abs=1e-5)


def test_heatmap_raw_and_a_title_that_fits(gpt2_tiny, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from mechsink.patching import SinkScore

    clean = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(gpt2_tiny, CORRUPTED, prepend_bos=True)
    metric = SinkScore(1) - 0.5 * SinkScore(1, 2) + 0.25 * SinkScore(0, 3)  # a long name
    res = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", metric)
    fig = mechsink.viz.heatmap(res, raw=True)
    ax = fig.axes[0]
    image = ax.images[0].get_array()
    assert torch.allclose(torch.tensor(image.data, dtype=torch.float64), res.values.float()
                          .double(), atol=1e-6)  # raw: the values themselves
    fig.canvas.draw()
    title = ax.title
    box = title.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width  # the title is inside the figure
    assert "denoise" in title.get_text()
    effects = mechsink.viz.heatmap(res).axes[0].images[0].get_array()
    corr = res.corrupted_value
    assert torch.allclose(torch.tensor(effects.data, dtype=torch.float64),
                          (res.values - corr).float().double(), atol=1e-6)


def test_attention_view_inlines_circuitsvis_and_the_caches_pattern(gpt2_tiny):
    tokens = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    with torch.no_grad():
        _, cache = gpt2_tiny.run_with_cache(tokens)
    view = mechsink.viz.attention(cache, tokens, layer=1, heads=[0, 2], model=gpt2_tiny)
    mechsink.viz.attention.reset_js()
    page = view._repr_html_()
    assert external_scripts(page) == [] and "CircuitsVis.render" in page
    start = page.index("CircuitsVis.AttentionHeads, ") + len("CircuitsVis.AttentionHeads, ")
    props = json.loads(page[start:page.index(");}else", start)])
    expected = cache[act_name("pattern", 1)][0, [0, 2]]
    assert torch.allclose(torch.tensor(props["attention"]), expected, atol=1e-6)
    assert props["tokens"] == gpt2_tiny.to_str_tokens(tokens[0])
    assert props["attentionHeadNames"] == ["L1H0", "L1H2"]
    assert "AttentionView" in repr(view) and len(repr(view)) < 200
    with pytest.raises(BadInputError, match="layer"):
        mechsink.viz.attention(cache)
    # the module is still a module
    from mechsink.viz.attention import attention_page  # noqa: F401


def test_inline_views_embed_circuitsvis_once_per_kernel():
    """#30 item 6: each inline view embedded circuitsvis's 1.3 MB script; now the kernel's first
    view carries it and later ones render once it is on the page (pages always carry it)."""
    from mechsink.viz.attention import circuitsvis_js

    view = mechsink.viz.attention(torch.eye(4).unsqueeze(0), layer=0)
    js = circuitsvis_js()
    mechsink.viz.attention.reset_js()
    first, second, third = (view._repr_html_() for _ in range(3))
    assert js in first and len(first) > 1_000_000
    assert js not in second and len(second) < 5_000 and len(third) < 5_000
    assert "window.CircuitsVis" in second and "reset_js()" in second
    assert second.count("CircuitsVis.render(") == 1
    mechsink.viz.attention.reset_js()
    assert js in view._repr_html_()
    assert js in view.html() and js in view.html()  # a standalone page always has it


def test_attention_view_of_a_census(tiny_census):
    view = mechsink.viz.attention(tiny_census, run="random/nobos")
    example = tiny_census.run("random", "nobos").example
    assert len(view.patterns) == len(example.heads)
    assert torch.allclose(torch.tensor(view.patterns[0]), example.patterns[0], atol=1e-4)
    with pytest.raises(BadInputError, match="no run"):
        mechsink.viz.attention(tiny_census, run="natural/bos")
    one = mechsink.viz.attention(tiny_census.run("random", "nobos"))
    assert one.patterns == view.patterns and one.tokens == view.tokens


def test_experiment_result_repr_is_short_and_its_card_is_the_summary():
    res = ExperimentResult("p0_sink", {"schema": "x/1", "model": "m", "big": list(range(5000))})
    assert len(repr(res)) < 120

    class Tabled(ExperimentResult):
        def summary(self) -> str:
            return "# Title\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"

    card = Tabled("p0_sink", {})._repr_html_()
    assert card is not None and "<h1>Title</h1>" in card and "<td>2</td>" in card


def test_progress_switch(capsys, monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.delenv(progress.ENV, raising=False)
    with progress.bar(3, "off-a-terminal") as b:
        b.update(3)
    err = capsys.readouterr().err  # pytest's stderr is no terminal: a log line, no bar
    assert err.startswith("off-a-terminal: 3/3 it in ") and err.count("\n") == 1
    progress.set_progress(True)
    try:
        with progress.bar(3, "forced-on") as b:
            b.update(3)
        assert "forced-on" in capsys.readouterr().err
        with progress.progress_disabled(), progress.bar(3, "inside-disabled") as b:
            b.update(3)
        assert "inside-disabled" not in capsys.readouterr().err
        assert progress.enabled()  # restored after the block
    finally:
        progress.set_progress(None)
    monkeypatch.setenv(progress.ENV, "1")
    with progress.bar(3, "by-env") as b:
        b.update(3)
    assert "by-env" in capsys.readouterr().err
    with pytest.raises(BadInputError):
        inspect.unwrap(progress.set_progress)("yes")  # as a user calls it (no type checker)
    assert os.environ[progress.ENV] == "1"


def test_progress_in_a_log_a_notebook_and_when_quick(capsys, monkeypatch):
    """#30 item 7: a log gets one line per phase with its time (none for quick phases); a
    notebook gets tqdm.auto's bar, left at its final state when it closes."""
    monkeypatch.delenv(progress.ENV, raising=False)
    with progress.bar(5, "quick") as b:  # under DELAY seconds: nothing
        b.update(5)
    with progress.phase("quick phase"):
        pass
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "DELAY", 0.0)
    with progress.phase("loading model"):
        pass
    with progress.bar(4, "census", unit="seq") as b:
        b.update(2)
        b.set_postfix_str("random/bos", refresh=False)
        b.update(2)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("loading model: ") and lines[0].endswith(" s")
    assert lines[1].startswith("census: 4/4 seq in ") and lines[1].endswith("s (random/bos)")
    monkeypatch.setattr(progress, "in_notebook", lambda: True)
    from tqdm.auto import tqdm as auto_tqdm

    with progress.bar(3, "in-a-notebook") as b:
        assert isinstance(b, auto_tqdm) and b.leave
        b.update(3)
    assert b.n == 3 and progress.mode() == "notebook"
    progress.set_progress(False)
    try:
        assert progress.mode() == "off"
    finally:
        progress.set_progress(None)
    capsys.readouterr()


def test_sweep_and_census_show_a_bar_when_asked(gpt2_tiny, capsys, monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 0.0)
    clean = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(gpt2_tiny, CORRUPTED, prepend_bos=True)
    progress.set_progress(True)
    try:
        activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", logit_metric)
        assert "patching" in capsys.readouterr().err
        census(gpt2_tiny, ["random"], ["bos"], n=2, seq_len=8, batch_size=1)
        assert "census" in capsys.readouterr().err
    finally:
        progress.set_progress(None)
    activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", logit_metric)
    err = capsys.readouterr().err  # automatic, stderr no terminal: one line, no bar
    assert err.startswith("patching resid_pre") and err.count("\n") == 1 and "\r" not in err


def test_census_figure_titles_fit_a_long_model_name(tiny_census, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mechsink.viz.figures import write_figures

    data = {**tiny_census.to_dict(), "model": "hf:/a/rather/long/folder/of/checkpoints/" + "x" * 40}
    plt.close("all")
    monkeypatch.setattr(plt, "close", lambda *a, **k: None)  # keep the figures to look at
    paths = write_figures(data, tmp_path)
    assert paths and all(p.stat().st_size > 0 for p in paths)
    figs = [plt.figure(n) for n in plt.get_fignums()]
    assert figs
    for fig in figs:
        fig.canvas.draw()
        texts = [fig._suptitle] if fig._suptitle is not None else []
        texts += [ax.title for ax in fig.axes if ax.get_title()]
        for text in texts:
            box = text.get_window_extent()
            assert box.x0 >= -1 and box.x1 <= fig.bbox.width + 1, text.get_text()
    monkeypatch.undo()
    plt.close("all")


def test_figures_are_written_atomically(tmp_path):
    """A save that fails half-way leaves neither a half figure nor a temporary file, and the
    figure is closed either way."""
    import matplotlib.pyplot as plt

    from mechsink.viz.style import save

    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    target = tmp_path / "f.png"
    def half_then_fail(handle, **kwargs):
        handle.write(b"\x89PNG half")
        raise RuntimeError("disk full")

    fig.savefig = half_then_fail
    with pytest.raises(RuntimeError, match="disk full"):
        save(fig, target)
    assert not target.exists() and not list(tmp_path.iterdir())
    assert not plt.fignum_exists(fig.number)
    fig2, ax2 = plt.subplots()
    ax2.plot([0, 1], [1, 0])
    assert save(fig2, target) == target and target.read_bytes()[:4] == b"\x89PNG"
