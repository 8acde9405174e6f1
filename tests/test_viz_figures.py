"""Figures at publication quality (#28 item 4), read from the matplotlib objects: no text under
8 pt as a reader sees it at page width, whole-number layer ticks, no two lines of a figure
sharing a colour and a dash, circuit line widths proportional to |effect| with the scale named,
and a colour legend beside every attention view whose colours are the view's own."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from mechsink.viz import style  # noqa: E402


@pytest.fixture
def kept(monkeypatch: pytest.MonkeyPatch) -> list:
    """The figures the functions would save, kept open (drawn) instead of written."""
    import mechsink.viz.discover as vd
    import mechsink.viz.experiments as vx
    import mechsink.viz.figures as vf

    got: list = []

    def keep(fig, path):
        fig.canvas.draw()
        got.append(fig)
        return path

    for module in (vf, vx):
        monkeypatch.setattr(module, "save", keep)
    monkeypatch.setattr(style, "save", keep)  # discover imports it at call time
    assert vd
    return got


@pytest.fixture(scope="module")
def census_data(llama_tiny) -> dict:
    from mechsink.measure.census import census

    return census(llama_tiny, n=2, seq_len=12, model_name="random:llama-tiny").to_dict()


def test_census_figures_read_at_8pt_with_whole_layer_ticks_and_distinct_lines(
        census_data: dict, kept: list, tmp_path) -> None:
    from mechsink.viz.figures import FIGURES

    assert len(census_data["runs"]) == 9  # 3 suites x 3 first-token variants
    for name, draw in FIGURES.items():
        draw(census_data, tmp_path / name)
    for name, fig in zip(FIGURES, kept, strict=True):
        assert fig.get_figwidth() <= style.PAGE_WIDTH + 1e-9, name
        assert style.smallest_text(fig) >= style.MIN_FONT, (name, style.smallest_text(fig))
        for ax in fig.axes:
            for axis, label in ((ax.xaxis, ax.get_xlabel()), (ax.yaxis, ax.get_ylabel())):
                if label in ("layer", "head", "position"):
                    lo, hi = sorted(axis.get_view_interval())
                    ticks = [t for t in axis.get_ticklocs() if lo <= t <= hi]
                    assert ticks and all(float(t).is_integer() for t in ticks), (name, label)
    by_name = dict(zip(FIGURES, kept, strict=True))
    for name in ("norm_ratio.png", "mlp_spikes.png"):
        keys = [k for ax in by_name[name].axes[:1] for k in _line_keys_of(ax)]
        assert len(keys) == 9 and len(set(keys)) == 9, (name, keys)  # nine runs, nine styles


def _line_keys_of(ax) -> list[tuple]:
    return [(matplotlib.colors.to_hex(ln.get_color()), ln.get_linestyle())
            for ln in ax.get_lines() if ln.get_label() and not ln.get_label().startswith("_")
            and len(ln.get_xdata()) > 1]


def _twins() -> dict:
    def run(scale):
        return {"losses": [5.0 - 0.01 * i * scale for i in range(120)],
                "timeline": [{"step": s, "sink_rate_no_self": 0.1 * scale * k}
                             for k, s in enumerate((0, 10, 40, 120))]}
    return {"eps": 0.3, "arms": {"softmax": [run(1.0), run(1.1)],
                                 "head-wise RMSNorm": [run(0.5)]}}


def _sink_free() -> dict:
    names = ["softmax", "softmax1", "sink_logit", "gated", "softpick", "sigmoid", "kv_bias",
             "extra_a", "extra_b"]
    arm = {"final": {"final_loss": 4.1, "sink_rate_no_self": 0.2, "max_sink_score": 0.5,
                     "max_abs_resid": 30.0, "first_token_norm_ratio": 2.0,
                     "stream_ppl_s0": 16.2, "stream_ppl_s1": 16.1, "stream_ratio": 1.006,
                     "int4_delta_loss": 0.004},
           "timeline": [{"step": s, "max_sink_score": 0.1 * k} for k, s in enumerate((0, 8, 16))]}
    return {"tasks": {"bb-llama-tiny": {"arms": {n: [arm, arm] for n in names}}}}


def test_experiment_figures_read_at_8pt_and_use_distinct_lines(kept: list, tmp_path) -> None:
    import mechsink.viz.experiments as vx
    from mechsink.experiments.sink_free import METRICS

    vx.plot_twins(_twins(), tmp_path / "t.png")
    vx.plot_sink_free(_sink_free(), tmp_path / "s.png", METRICS)
    heads = [{"layer": 3, "head": h, "sink_score": 0.5} for h in range(4)]
    vx.plot_ablations({"model": "m", "sink_heads": heads, "ablations": {
        f"ablation {i}": {"per_head": [0.1 * i] * 4} for i in range(9)}}, tmp_path / "a.png")
    vx.plot_timeline({"run": "r", "points": [
        {"step": s, "sink_rate_no_self": 0.1, "first_token_norm_ratio": 2.0,
         "max_abs_resid": 9.0, "loss": 3.0} for s in (0, 1, 10, 100)]}, tmp_path / "l.png")
    for fig in kept:
        assert fig.get_figwidth() <= style.PAGE_WIDTH + 1e-9
        assert style.smallest_text(fig) >= style.MIN_FONT
    timelines = _line_keys_of(kept[1].axes[len(METRICS)])  # the timeline panel: nine arms
    assert len(timelines) == 9 and len(set(timelines)) == 9
    bars = kept[2].axes[0].containers  # nine ablations + baseline: no (colour, hatch) repeats
    keys = {(matplotlib.colors.to_hex(c.patches[0].get_facecolor()), c.patches[0].get_hatch())
            for c in bars}
    assert len(keys) == len(bars) == 10


def test_edge_circuit_widths_follow_absolute_score_and_name_the_scale(kept: list,
                                                                      tmp_path) -> None:
    from mechsink.viz.discover import draw_circuit

    edges = [{"sender": "L0H0", "receiver": "L1H1.q", "score": 2.0},
             {"sender": "L0H1", "receiver": "metric", "score": -0.5},
             {"sender": "embed", "receiver": "MLP1", "score": 1.0}]
    circuit = {"graph": {"n_heads": 2, "n_layers": 2, "n_kv_heads": 2,
                         "senders": ["embed", "L0H0", "L0H1", "MLP0", "MLP1"]},
               "edges": edges, "n_edges": 3, "how": "eap", "faithfulness": 0.8}
    draw_circuit(circuit, tmp_path / "c.png")
    fig = kept[0]
    assert fig.get_figwidth() <= style.PAGE_WIDTH + 1e-9
    assert style.smallest_text(fig) >= style.MIN_FONT
    ax = fig.axes[0]
    drawn = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 2]
    widths = [ln.get_linewidth() for ln in drawn]
    want = [0.5 + 3.5 * abs(e["score"]) / 2.0 for e in edges]
    assert widths == pytest.approx(want)
    assert drawn[1].get_linestyle() == "--"  # negative
    legend = " ".join(t.get_text() for t in ax.get_legend().get_texts())
    assert "|score| 2" in legend


def test_attention_views_carry_a_colour_legend_in_their_own_colours() -> None:
    import torch

    from mechsink.viz import attention as va
    from mechsink.viz.gallery import attention_block

    heads = [{"layer": 0, "head": 0, "sink_score": 0.9, "pattern": [[1.0], [0.9, 0.1]]}]
    block = attention_block("cv-a", ["a", "b"], heads)
    start = block.index('id="cv-a-data">') + len('id="cv-a-data">')
    props = json.loads(block[start:block.index("</script>", start)])
    assert props["positiveColor"] == va.POSITIVE_COLOUR and props["maxValue"] == 1
    legend = block[block.index("mechsink-cv-legend"):block.index('id="cv-a"')]
    assert f"linear-gradient(to right,#ffffff,{va.POSITIVE_COLOUR})" in legend
    assert va.MASKED_COLOUR in legend and "attention weight" in legend
    view = va.attention(torch.tensor([[[1.0, 0.0], [0.3, 0.7]]]), ["a", "b"])
    assert view.props()["positiveColor"] == va.POSITIVE_COLOUR
    assert "mechsink-cv-legend" in view._body("d", with_js=False)


def test_query_bias_dose_figure_reads_at_8pt_and_draws_the_verdicts_threshold(
        kept: list, tmp_path) -> None:
    import mechsink.viz.experiments as vx

    def curve(removed):
        return {"rows": [{"dose": d, "late_sink_score": {
            "mean": 0.6 * (removed + (1 - removed) * min(d, 1)), "low": 0.5, "high": 0.7}}
            for d in (0.0, 0.5, 1.0, 2.0)]}
    parts = ["b_Q", "b_Q . k_0 only", "layer-0 MLP at position 0", "W_K structure"]
    data = {"model": "qwen2.5-0.5b", "curves": {p: curve(0.1 * i) for i, p in enumerate(parts)},
            "verdicts": {p: {"verdict": "necessary"} for p in parts}}
    vx.plot_query_bias_dose(data, tmp_path / "q.png")
    fig = kept[0]
    assert fig.get_figwidth() <= style.PAGE_WIDTH + 1e-9
    assert style.smallest_text(fig) >= style.MIN_FONT
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == [f"{p}: necessary" for p in parts]
    half = [ln.get_ydata()[0] for ln in panels[0].get_lines() if ln.get_linestyle() == "--"]
    assert half == [pytest.approx(0.3)]  # half the clean score (0.6 at dose 1)
    assert vx.plot_query_bias_dose({"model": "m", "curves": {}}, tmp_path / "n.png") is None
