"""Experiment figures legible at page width (#30 item 6): fonts >= 8 pt at a page-wide size,
a channel axis that does not exaggerate a 12% change, both dose-response curves, line widths
by absolute effect, whole-number layer ticks."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import mechsink.viz.experiments as vx  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    got = []

    def keep(fig, path):
        got.append(fig)
        return path

    monkeypatch.setattr(vx, "save", keep)
    return got


def _ci(v):
    return {"mean": v, "low": v - 0.02, "high": v + 0.02}


def _structural(channel_change=0.12):
    doses = [0.0, 0.1, 0.5, 1.0, 2.0]

    def curve(scale, sink):
        return {"target": "set", "half_effect": {"dose": 0.5}, "rows": [
            {"dose": d, "channel": _ci(100 * (1 + channel_change * min(d, 1) * scale)),
             "late_sink_score": None if sink is None else _ci(sink * min(d, 1) + 0.1),
             "sink_rate": _ci(0.5)} for d in doses]}

    return {"model": "gemma3-270m", "super_neuron_sets": {"creating_layer": 3, "channel": 443},
            "dose_response": {"creating_set": curve(1.0, 0.6), "top_neuron_only": curve(0.3, None)},
            "surgery": {"layer": 4, "rows": [
                {"condition": "clean", "late_sink_score": _ci(0.7), "sink_rate": _ci(0.5)},
                {"condition": "channel 443, every block from 4", "late_sink_score": None,
                 "sink_rate": _ci(0.2)}]},
            "move": [{"k": 4, "intervention": "channel planted", "sink_at_k_before": 0.01,
                      "sink_at_k_after": 0.4}]}


def _texts(fig):
    out = [t for t in fig.findobj(matplotlib.text.Text) if t.get_text().strip()]
    assert out
    return out


def test_structural_origin_is_page_wide_and_honest_about_a_small_change(figures, tmp_path):
    vx.plot_structural_origin(_structural(), tmp_path / "s.png")
    fig = figures[0]
    assert fig.get_figwidth() <= 7.6
    assert min(t.get_fontsize() for t in _texts(fig)) >= vx.MIN_FONT
    dose = fig.axes[0]
    assert dose.get_yscale() == "linear" and dose.get_ylim()[0] == 0  # a 12% change stays 12%
    labels = [line.get_label() for line in dose.get_lines()]
    assert "|channel|, complete set" in labels and "|channel|, top neuron only" in labels
    legend = dose.get_legend()
    assert "not measured" in legend.get_title().get_text()
    big = _structural(channel_change=50.0)
    vx.plot_structural_origin(big, tmp_path / "b.png")
    assert figures[1].axes[0].get_yscale() == "log"  # past a factor of 10: log


def test_p0_circuit_widths_follow_absolute_effect_and_fonts_fit(figures, tmp_path):
    nodes = [{"name": f"L{la}H{h}", "via_mlp_to_channel": float(la * 9 + h),
              "direct_to_sink": 1.0 if la == 0 and h < 2 else 0.0, "via_mlp_to_sink": 0.0}
             for la in range(30) for h in range(9)]
    result = {"model": "smollm2-135m", "nodes": nodes, "circuit": {"members": ["L29H8"]},
              "clean": {"via_mlp_to_channel": 300.0},
              "edges": [{"via": "MLP3", "to": "channel 507 @0", "metric": "massive_value"},
                        {"via": None, "to": "sink @key0 (L5)", "metric": "sink_score"}]}
    vx.plot_p0_circuit(result, tmp_path / "p.png")
    fig = figures[0]
    assert fig.get_figwidth() <= 7.6
    assert min(t.get_fontsize() for t in _texts(fig)) >= vx.MIN_FONT
    graph, bars = fig.axes[0], fig.axes[1]
    red = sorted((ln.get_linewidth(), ln.get_xydata()[0][1]) for ln in graph.get_lines()
                 if ln.get_color() == vx.RED)
    assert red[-1][0] > 3 * red[0][0]  # width grows with |effect|
    legend = " ".join(t.get_text() for t in graph.get_legend().get_texts())
    assert "widest line |effect| = 269" in legend
    assert len(bars.get_xticklabels()) == 30 and bars.get_xticklabels()[0].get_text() == "L29H8"


def test_census_layer_axes_have_whole_number_ticks(monkeypatch, tmp_path):
    import mechsink.viz.figures as vf

    got = []
    monkeypatch.setattr(vf, "save", lambda fig, path: got.append(fig) or path)
    run = {"suite": "random", "variant": "bos", "name": "random/bos",
           "layer_magnitudes": {"top1": [1.0, 5.0, 9.0], "median": [0.1, 0.2, 0.3]},
           "first_token_norm_ratio": [1.0, 3.0, 9.0]}
    vf.magnitudes({"model": "m", "runs": [run]}, tmp_path / "m.png")
    vf.norm_ratios({"model": "m", "runs": [run]}, tmp_path / "n.png")
    for fig in got:
        fig.canvas.draw()
        ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= 2]
        assert ticks and all(float(t).is_integer() for t in ticks)
