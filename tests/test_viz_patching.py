"""Patching figures drawn for the shape of the data (#30 item 6): one layer x head panel per
position for big z-by-position results, thinned labels, path patching's senders as a grid."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402

from mechsink.patching.result import PatchResult  # noqa: E402
from mechsink.viz.patching import MAX_LABELS, heatmap  # noqa: E402

TOKENS = ["<s>", "When", " Mary", " and", " John", " went", " to", " the"]


def _z(n_layers, n_heads, n_pos=8):
    g = torch.Generator().manual_seed(0)
    values = torch.randn(n_layers, n_pos, n_heads, generator=g, dtype=torch.float64)
    return PatchResult(values, ("layer", "pos", "head"),
                       {"layer": list(range(n_layers)), "pos": list(range(n_pos)),
                        "head": list(range(n_heads))}, "z", "logit_diff", 1.0, -1.0,
                       TOKENS[:n_pos], {"direction": "denoise"})


def _images(fig):
    return [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]


def test_big_z_by_position_is_one_panel_per_position():
    result = _z(30, 9)
    fig = heatmap(result)
    panels = _images(fig)
    assert len(panels) == 8  # one per position, each layer x head
    for p, ax in enumerate(panels):
        data = ax.images[0].get_array()
        assert data.shape == (30, 9)
        expected = (result.values[:, p, :] - result.corrupted_value).float().numpy()
        assert abs(data - expected).max() < 1e-5
        assert len(ax.get_yticklabels()) <= 10 and TOKENS[p].strip() in ax.get_title()
    lims = {ax.images[0].get_clim() for ax in panels}
    assert len(lims) == 1  # one colour scale


def test_small_z_stays_one_heatmap_and_long_rows_are_thinned():
    fig = heatmap(_z(2, 4))
    assert len(_images(fig)) == 1 and len(fig.axes[0].get_yticklabels()) == 8
    tall = PatchResult(torch.zeros(300, 4, dtype=torch.float64), ("neuron", "pos"),
                       {"neuron": list(range(300)), "pos": list(range(4))}, "neuron",
                       "m", 0.0, 1.0, TOKENS[:4], {})
    ax = _images(heatmap(tall))[0]
    assert len(ax.get_yticklabels()) <= MAX_LABELS
    assert ax.get_yticklabels()[1].get_text() == "N8"


def test_path_senders_are_a_layer_by_head_grid_not_a_strip():
    senders = [f"L{la}H{h}" for la in range(30) for h in range(9)] + [f"MLP{la}" for la in
                                                                        range(30)]
    values = torch.arange(len(senders), dtype=torch.float64)
    result = PatchResult(values, ("sender",), {"sender": senders}, "path", "sink_score",
                         0.0, None, [], {"direction": "noise"})
    fig = heatmap(result)
    w, h = fig.get_size_inches()
    assert h > w  # 30 layers tall, 10 columns wide: not a 2400 x 375 strip
    grid = _images(fig)[0].images[0].get_array()
    assert grid.shape == (30, 10)
    assert grid[3, 5] == senders.index("L3H5") and grid[7, 9] == senders.index("MLP7")
    other = [f"L{i}N{i * 7}" for i in range(90)]
    wrapped = PatchResult(torch.ones(90, dtype=torch.float64), ("sender",), {"sender": other},
                          "path", "m", 0.0, None, [], {"direction": "noise"})
    data = _images(heatmap(wrapped))[0].images[0].get_array()
    assert data.shape[0] > 1 and data.shape[0] * data.shape[1] >= 90
