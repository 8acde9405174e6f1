"""Activation patching: agreement with transformer_lens.patching, metrics, bad input, hooks."""

from __future__ import annotations

import pytest
import torch
import transformer_lens.patching as tlp

from mechsink.errors import BadInputError
from mechsink.model import run_from_layer, to_tokens
from mechsink.patching import (
    KLToClean,
    LogitDiff,
    LogProb,
    MassiveValue,
    PatchResult,
    ResidNorm,
    SinkScore,
    activation_patch,
    parse_site,
)
from mechsink.patching.checks import SaturatedMetricWarning

CLEAN = "When Mary and John went"
CORRUPTED = "When Tom and John went"

# mechsink site -> transformer_lens.patching function (every site they share)
SHARED = {
    "resid_pre": "get_act_patch_resid_pre",
    "resid_mid": "get_act_patch_resid_mid",
    "attn_out": "get_act_patch_attn_out",
    "mlp_out": "get_act_patch_mlp_out",
    "z": "get_act_patch_attn_head_out_by_pos",
    "q": "get_act_patch_attn_head_q_by_pos",
    "k": "get_act_patch_attn_head_k_by_pos",
    "v": "get_act_patch_attn_head_v_by_pos",
    "z_all_pos": "get_act_patch_attn_head_out_all_pos",
    "q_all_pos": "get_act_patch_attn_head_q_all_pos",
    "k_all_pos": "get_act_patch_attn_head_k_all_pos",
    "v_all_pos": "get_act_patch_attn_head_v_all_pos",
    "pattern_all_pos": "get_act_patch_attn_head_pattern_all_pos",
    "pattern_by_pos": "get_act_patch_attn_head_pattern_by_pos",
}


def logit_metric(logits: torch.Tensor) -> torch.Tensor:
    """A TransformerLens-style metric: plain callable on logits."""
    return logits[0, -1, 100] - logits[0, -1, 200]


def _pair(model):
    return (to_tokens(model, CLEAN, prepend_bos=True),
            to_tokens(model, CORRUPTED, prepend_bos=True))


@pytest.fixture(params=["gpt2_tiny", "llama_tiny"])
def tiny(request):
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("site", list(SHARED))
def test_equals_transformer_lens(tiny, site):
    clean, corrupted = _pair(tiny)
    with torch.no_grad():
        _, cache = tiny.run_with_cache(clean)
        ref = getattr(tlp, SHARED[site])(tiny, corrupted, cache, logit_metric)
    got = activation_patch(tiny, clean, corrupted, site, logit_metric)
    assert got.values.shape == ref.shape
    assert (got.values - ref.double()).abs().max() <= 1e-4
    assert ref.abs().max() > 1e-3  # the comparison is not trivially zero


def test_batch_size_does_not_change_values(llama_tiny):
    clean, corrupted = _pair(llama_tiny)
    a = activation_patch(llama_tiny, clean, corrupted, "z", logit_metric, batch_size=1)
    b = activation_patch(llama_tiny, clean, corrupted, "z", logit_metric, batch_size=7)
    assert (a.values - b.values).abs().max() <= 1e-5


def test_run_from_layer_equals_full_forward(tiny):
    clean, _ = _pair(tiny)
    with torch.no_grad():
        logits, cache = tiny.run_with_cache(clean)
        for layer in range(tiny.cfg.n_layers):
            out = run_from_layer(tiny, cache[f"blocks.{layer}.hook_resid_pre"], layer)
            assert (out - logits).abs().max() <= 1e-5


def test_clean_into_clean_gives_clean_metric(tiny):
    clean, _ = _pair(tiny)
    res = activation_patch(tiny, clean, clean, "z", LogitDiff(100, 200))
    assert (res.values - res.clean_value).abs().max() <= 1e-5
    res = activation_patch(tiny, clean, clean, "resid_pre", SinkScore(1))
    assert (res.values - res.clean_value).abs().max() <= 1e-6


def test_full_layer_patch_recovers_clean(tiny):
    clean, corrupted = _pair(tiny)
    res = activation_patch(tiny, clean, corrupted, "resid_pre_all_pos", LogitDiff(100, 200),
                           normalize=True)
    assert torch.allclose(res.values[0], torch.tensor(1.0, dtype=torch.float64), atol=1e-4)


def test_logit_metrics_match_plain_callables(tiny):
    clean, corrupted = _pair(tiny)

    def log_prob(lg):
        return lg[:, -1].log_softmax(-1)[:, 100].mean()

    a = activation_patch(tiny, clean, corrupted, "attn_out", LogProb(100))
    b = activation_patch(tiny, clean, corrupted, "attn_out", log_prob)
    assert (a.values - b.values).abs().max() <= 1e-5
    c = activation_patch(tiny, clean, corrupted, "attn_out", LogitDiff(100, 200))
    d = activation_patch(tiny, clean, corrupted, "attn_out", logit_metric)
    assert (c.values - d.values).abs().max() <= 1e-5


def test_activation_metrics_match_a_hook_loop(tiny):
    """Early-stopped sink/massive/norm metrics equal a plain one-forward-per-patch loop."""
    clean, corrupted = _pair(tiny)
    metric = SinkScore(1) + 0.5 * MassiveValue(0, 0, 3) - ResidNorm(1, 2)
    res = activation_patch(tiny, clean, corrupted, "v", metric)
    with torch.no_grad():
        _, cache = tiny.run_with_cache(clean)
        for layer, pos, head in [(0, 2, 1), (1, 0, 0), (0, 4, 1)]:
            def hook(act, hook, pos=pos, head=head, layer=layer):
                act[:, pos, head] = cache[f"blocks.{layer}.attn.hook_v"][:, pos, head]
                return act

            with tiny.hooks(fwd_hooks=[(f"blocks.{layer}.attn.hook_v", hook)]):
                _, c2 = tiny.run_with_cache(corrupted)
            expected = (c2["blocks.1.attn.hook_pattern"][:, :, :, 0].mean(-1).mean()
                        + 0.5 * c2["blocks.0.hook_resid_post"][0, 0, 3]
                        - c2["blocks.1.hook_resid_post"][0, 2].norm())
            assert abs(res.values[layer, pos, head].item() - expected.item()) <= 1e-5


def test_kl_to_clean_is_zero_for_clean_patches(gpt2_tiny):
    clean, corrupted = _pair(gpt2_tiny)
    # the tiny random model barely moves its predictions: the KL is near its bound on both
    with pytest.warns(SaturatedMetricWarning, match="kl_to_clean"):
        res = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre_all_pos", KLToClean())
    assert res.clean_value == pytest.approx(0.0, abs=1e-6)
    assert res.corrupted_value > 0
    assert abs(res.values[0].item()) <= 1e-5


def test_neuron_and_dest_src_sites_run(llama_tiny):
    clean, corrupted = _pair(llama_tiny)
    from mechsink.patching import Site

    res = activation_patch(llama_tiny, clean, corrupted,
                           Site("neuron", "by_pos", layers=(0,), units=(0, 5, 17)), SinkScore(1))
    assert res.values.shape == (1, 6, 3)
    res = activation_patch(llama_tiny, clean, corrupted,
                           Site("pattern", "dest_src", layers=(1,), units=(0,)), logit_metric)
    assert res.values.shape == (1, 1, 6, 6)


def test_ablations(llama_tiny):
    clean, corrupted = _pair(llama_tiny)
    zero = activation_patch(llama_tiny, clean, corrupted, "z_all_pos", logit_metric,
                            ablation="zero")
    mean = activation_patch(llama_tiny, clean, corrupted, "z_all_pos", logit_metric,
                            ablation="batch_mean", reference=torch.cat([clean, corrupted]))
    assert zero.values.shape == mean.values.shape == (2, 4)
    assert not torch.allclose(zero.values, mean.values)
    with torch.no_grad():  # zero-ablating L1H2 by hand gives the same number
        def hook(act, hook):
            act[:, :, 2] = 0.0
            return act

        expected = logit_metric(llama_tiny.run_with_hooks(
            corrupted, fwd_hooks=[("blocks.1.attn.hook_z", hook)]))
    assert abs(zero.values[1, 2].item() - expected.item()) <= 1e-5


def test_result_frame_json_heatmap(tmp_path, gpt2_tiny):
    clean, corrupted = _pair(gpt2_tiny)
    res = activation_patch(gpt2_tiny, clean, corrupted, "z", logit_metric)
    frame = res.to_frame()
    assert len(frame) == res.values.numel()
    assert {"layer", "pos", "head", "pos_token", "value"} <= set(frame.columns)
    path = res.to_json(tmp_path / "r.json")
    back = PatchResult.from_json(path)
    assert torch.allclose(back.values, res.values) and back.axes == res.axes
    from mechsink.viz.patching import heatmap

    fig = heatmap(path)
    fig.savefig(tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 0


# --- bad input and hook hygiene ---------------------------------------------------------


def test_shape_mismatch(gpt2_tiny):
    clean = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    with pytest.raises(BadInputError, match="shapes"):
        activation_patch(gpt2_tiny, clean, clean[:, :-1], "z", logit_metric)


@pytest.mark.parametrize(
    ("site", "restrict", "message"),
    [
        ("nonsense", {}, "unknown site"),
        ("z", {"layers": (2,)}, "layer 2 is out of range"),
        ("z", {"units": (4,)}, "head 4 is out of range"),
        ("k", {"units": (2,)}, "KV head 2 is out of range"),
        ("resid_pre", {"positions": (6,)}, "position 6 is out of range"),
        ("neuron", {"units": (10_000,)}, "neuron 10000 is out of range"),
    ],
)
def test_bad_sites(llama_tiny, site, restrict, message):
    clean, corrupted = _pair(llama_tiny)
    with pytest.raises(BadInputError, match=message):
        activation_patch(llama_tiny, clean, corrupted, parse_site(site, **restrict)
                         if site != "nonsense" else site, logit_metric)


def test_bad_metric_values(gpt2_tiny):
    clean, corrupted = _pair(gpt2_tiny)
    with pytest.raises(BadInputError, match="shape"):
        activation_patch(gpt2_tiny, clean, corrupted, "z", lambda lg: lg[0, -1])
    with pytest.raises(BadInputError, match="finite"):
        activation_patch(gpt2_tiny, clean, corrupted, "z", lambda lg: lg.sum() * float("nan"))
    with pytest.raises(BadInputError, match="layer 7"):
        activation_patch(gpt2_tiny, clean, corrupted, "z", SinkScore(7))


def test_hooks_removed_after_metric_raises_mid_sweep(tiny):
    clean, corrupted = _pair(tiny)
    with torch.no_grad():
        before = tiny(corrupted)
    calls = {"n": 0}

    def flaky(lg):
        calls["n"] += 1
        if calls["n"] > 4:  # after the two baselines and two patches
            raise RuntimeError("boom")
        return lg[0, -1, 0]

    with pytest.raises(RuntimeError, match="boom"):
        activation_patch(tiny, clean, corrupted, "z", flaky, batch_size=3)
    assert calls["n"] == 5
    calls["n"] = 0

    def nan_after_baselines(lg):
        calls["n"] += 1
        return lg[0, -1, 0] * (float("nan") if calls["n"] > 2 else 1.0)

    with pytest.raises(BadInputError, match=r"while patching z_by_pos .*\(patch 0\)"):
        activation_patch(tiny, clean, corrupted, "z", nan_after_baselines)
    assert calls["n"] == 3  # the error came from the first patched value, inside the sweep
    with torch.no_grad():
        after = tiny(corrupted)
    assert torch.equal(before, after)
    assert all(not hp.fwd_hooks for hp in tiny.hook_dict.values())


# --- the real model ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(("site", "layers"), [("resid_pre", (0, 29)), ("z", (29,)), ("k", (14,)),
                                              ("v_all_pos", (0, 29))])
def test_equals_transformer_lens_smollm2(smollm2, site, layers):
    """Real GQA model (9 query / 3 KV heads); TransformerLens runs one forward per cell, so a
    few layers only (each bridge forward of smollm2 costs about a second on 2 CPU cores)."""
    clean = to_tokens(smollm2, "The cat sat", prepend_bos=True)
    corrupted = to_tokens(smollm2, "The dog sat", prepend_bos=True)
    fn = getattr(tlp, SHARED[site])
    with torch.no_grad():
        _, cache = smollm2.run_with_cache(clean)
    res = activation_patch(smollm2, clean, corrupted, parse_site(site, layers=layers),
                           logit_metric)
    # TransformerLens runs every layer; compare on the layers we computed
    with torch.no_grad():
        ref = _tl_on_layers(smollm2, fn, site, corrupted, cache, layers)
    assert (res.values - ref.double()).abs().max() <= 1e-4


def _tl_on_layers(model, fn, site, corrupted, cache, layers, metric=None):
    """transformer_lens.patching restricted to some layers, via its own index_df path."""
    import itertools

    import pandas as pd

    axes = fn.keywords["index_axis_names"]
    n_heads = model.cfg.n_heads if site[0] not in "kv" else model.cfg.n_key_value_heads
    ranges = {"layer": layers, "pos": range(corrupted.shape[1]), "head": range(n_heads),
              "head_index": range(n_heads)}
    rows = list(itertools.product(*(ranges[a] for a in axes)))
    df = pd.DataFrame(rows, columns=list(axes))
    flat = tlp.generic_activation_patch(model, corrupted, cache, metric or logit_metric,
                                        fn.keywords["patch_setter"],
                                        fn.keywords["activation_name"], index_df=df)
    return flat.reshape(len(layers), *[len(ranges[a]) for a in axes[1:]])


# --- prefix reuse, memory budget, metric and token errors -------------------------------


@pytest.fixture
def no_prefix_reuse():
    """Run the body with prefix reuse switched off (restored afterwards)."""
    from mechsink.patching import engine

    engine.SPEEDUPS["prefix_reuse"] = False
    yield
    engine.SPEEDUPS["prefix_reuse"] = True


def _sweep_both_ways(model, site, metric, **kw):
    from mechsink.patching import engine, plan

    clean, corrupted = _pair(model)
    seen = []  # suffix lengths of the patched forwards (positions actually computed)

    def spy(act, hook):
        seen.append(act.shape[1])

    # a tiny model's blocks cost less than a block call: the batching would merge every
    # position into one forward from 0, so price the calls at 0 to exercise late starts
    cost, plan.BLOCK_CALL_COST = plan.BLOCK_CALL_COST, 0
    try:
        with model.hooks(fwd_hooks=[("blocks.1.hook_resid_pre", spy)]):
            fast = activation_patch(model, clean, corrupted, site, metric, **kw)
    finally:
        plan.BLOCK_CALL_COST = cost
    engine.SPEEDUPS["prefix_reuse"] = False
    try:
        plain = activation_patch(model, clean, corrupted, site, metric, **kw)
    finally:
        engine.SPEEDUPS["prefix_reuse"] = True
    return fast, plain, seen


@pytest.mark.parametrize("site", ["resid_pre", "z", "k", "resid_mid", "neuron",
                                  "pattern_dest_src", "pattern_by_pos", "mlp_out"])
@pytest.mark.parametrize("metric", ["logits", "logit_diff", "sink", "massive"])
def test_prefix_reuse_equals_the_plain_patch(tiny, site, metric):
    """Recomputing only the positions from the earliest patched one gives the same sweep, on
    GPT-2 (absolute positions, learned query bias) and Llama (rotary, GQA) families."""
    metrics = {"logits": logit_metric, "logit_diff": LogitDiff(100, 200),
               "sink": SinkScore(1), "massive": MassiveValue(1, 0, 3) + ResidNorm(1, 4)}
    the_site = parse_site(site, layers=(1,)) if site.startswith("pattern") or site == "neuron" \
        else site
    if site == "neuron":
        the_site = parse_site("neuron", layers=(0, 1), units=(0, 7))
    fast, plain, seen = _sweep_both_ways(tiny, the_site, metrics[metric])
    assert (fast.values - plain.values).abs().max() <= 1e-5
    assert (fast.values - fast.corrupted_value).abs().max() > 1e-6  # the patches do something
    assert min(seen) < 6  # some forwards really started after position 0


@pytest.mark.parametrize("site", ["resid_pre", "z", "k", "resid_mid", "neuron",
                                  "pattern_dest_src", "mlp_out", "attn_out"])
@pytest.mark.parametrize("metric", ["logit_diff", "sink", "massive"])
def test_staircase_equals_one_layer_per_forward(tiny, site, metric):
    """Patches at different layers sharing a forward (each copy joining the batch at its own
    block, with prefix reuse) give the same sweep as one forward per layer; and the batch
    really grew on the way (block 1 saw more rows than block 0)."""
    from mechsink.patching import engine

    metrics = {"logit_diff": LogitDiff(100, 200), "sink": SinkScore(1),
               "massive": MassiveValue(1, 0, 3) + ResidNorm(0, 4)}
    the_site = parse_site(site, layers=(0, 1)) if site.startswith("pattern") else site
    if site == "neuron":
        the_site = parse_site("neuron", layers=(0, 1), units=(0, 7))
    clean, corrupted = _pair(tiny)
    rows: dict[int, list[int]] = {0: [], 1: []}

    def spy(layer):
        return lambda act, hook: rows[layer].append(act.shape[0])

    with tiny.hooks(fwd_hooks=[(f"blocks.{i}.attn.hook_q", spy(i)) for i in (0, 1)]):
        stairs = activation_patch(tiny, clean, corrupted, the_site, metrics[metric])
    engine.SPEEDUPS["staircase"] = False
    try:
        plain = activation_patch(tiny, clean, corrupted, the_site, metrics[metric])
    finally:
        engine.SPEEDUPS["staircase"] = True
    assert (stairs.values - plain.values).abs().max() <= 1e-5
    assert (stairs.values - stairs.corrupted_value).abs().max() > 1e-6
    grew = [b > a for a, b in zip(rows[0], rows[1], strict=False)]
    assert any(grew), rows


def test_prefix_reuse_with_ablations_and_restricted_positions(llama_tiny):
    site = parse_site("resid_pre_all_pos", positions=(3, 5))
    for ablation in ("zero", "batch_mean", "position_mean", "resample"):
        fast, plain, seen = _sweep_both_ways(llama_tiny, site, LogitDiff(100, 200),
                                             ablation=ablation, direction="noise")
        assert (fast.values - plain.values).abs().max() <= 1e-5
        assert min(seen) == 3


def test_position_mean_ablation_equals_a_hand_computed_hook(llama_tiny):
    """position_mean at (layer 1, pos 2) writes the mean of the other positions' resid."""
    clean, corrupted = _pair(llama_tiny)
    res = activation_patch(llama_tiny, clean, corrupted, parse_site("resid_pre", layers=(1,)),
                           logit_metric, ablation="position_mean", direction="noise")

    def hook(act, hook):
        others = [p for p in range(act.shape[1]) if p != 2]
        act[:, 2] = act[:, others].mean(1)
        return act

    with torch.no_grad():
        expected = logit_metric(llama_tiny.run_with_hooks(
            clean, fwd_hooks=[("blocks.1.hook_resid_pre", hook)]))
    assert abs(res.values[0, 2].item() - expected.item()) <= 1e-5


def test_memory_budget_bounds_every_patched_forward(llama_tiny):
    """With a small budget, the largest activation of any patched forward stays within it
    (measured on the tensors the hooks see), and the values do not change."""
    from mechsink.patching import plan

    clean, corrupted = _pair(llama_tiny)
    one = plan.bytes_per_copy(llama_tiny, 1, clean.shape[1], 0, -1)
    budget = 3 * one
    peak = {"bytes": 0}

    def measure(act, hook):
        peak["bytes"] = max(peak["bytes"], act.numel() * act.element_size())

    names = ["blocks.0.hook_resid_pre", "blocks.1.attn.hook_attn_scores",
             "blocks.1.attn.hook_pattern", "blocks.1.mlp.hook_post", "blocks.1.hook_resid_post",
             "hook_unembed"]
    with llama_tiny.hooks(fwd_hooks=[(n, measure) for n in names]):
        small = activation_patch(llama_tiny, clean, corrupted, "resid_pre", logit_metric,
                                 memory_budget=budget)
    assert 0 < peak["bytes"] <= budget
    big = activation_patch(llama_tiny, clean, corrupted, "resid_pre", logit_metric)
    assert (small.values - big.values).abs().max() <= 1e-5
    assert plan.copies_per_batch(llama_tiny, 1, 6, 0, -1, memory_budget=budget) == 3


@pytest.mark.parametrize("bad", [None, "0.5", [1.0]])
def test_metric_returning_a_non_number_is_named(gpt2_tiny, bad):
    clean, corrupted = _pair(gpt2_tiny)

    def odd_metric(logits):
        return bad

    with pytest.raises(BadInputError, match=r"metric 'odd_metric' returned .*(None|str|list)"):
        activation_patch(gpt2_tiny, clean, corrupted, "z", odd_metric)


def test_tokens_outside_the_vocabulary_fail_before_any_forward(gpt2_tiny):
    clean, corrupted = _pair(gpt2_tiny)
    bad = clean.clone()
    bad[0, 2] = gpt2_tiny.cfg.d_vocab + 5
    calls = {"n": 0}

    def count(act, hook):
        calls["n"] += 1

    with gpt2_tiny.hooks(fwd_hooks=[("hook_embed", count)]):
        with pytest.raises(BadInputError, match=f"token id {gpt2_tiny.cfg.d_vocab + 5}"):
            activation_patch(gpt2_tiny, bad, corrupted, "z", logit_metric)
        with pytest.raises(BadInputError, match="token id -1"):
            activation_patch(gpt2_tiny, clean, corrupted * 0 - 1, "z", logit_metric)
    assert calls["n"] == 0


def test_progress_bar_is_silent_off_a_terminal(gpt2_tiny, capsys):
    clean, corrupted = _pair(gpt2_tiny)
    activation_patch(gpt2_tiny, clean, corrupted, "z", logit_metric)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


@pytest.mark.slow
def test_prefix_reuse_on_gemma_sliding_window_layers():
    """Gemma 3 (sliding-window and global layers, two rotary bases, GQA 4q/1kv): the resid_pre
    and z sweeps with prefix reuse and the staircase equal the plain ones, and the plain one equals
    TransformerLens's own loop on one layer."""
    from mechsink import load_model
    from mechsink.patching import engine

    model = load_model("gemma3-270m", device="cpu")
    clean = to_tokens(model, "When Mary and John went to the store, John", prepend_bos=True)
    corrupted = to_tokens(model, "When Mary and John went to the store, Mary", prepend_bos=True)
    metric = LogitDiff(100, 200)
    for site in (parse_site("resid_pre", layers=(1, 5, 7)), parse_site("z", layers=(5,))):
        fast = activation_patch(model, clean, corrupted, site, metric)
        engine.SPEEDUPS["prefix_reuse"] = engine.SPEEDUPS["staircase"] = False
        try:
            plain = activation_patch(model, clean, corrupted, site, metric)
        finally:
            engine.SPEEDUPS["prefix_reuse"] = engine.SPEEDUPS["staircase"] = True
        # 1e-5 relative: the logit difference is about -25 here, where float32 rounding of
        # differently shaped batches alone moves values by a few 1e-6
        scale = max(1.0, plain.values.abs().max().item())
        assert (fast.values - plain.values).abs().max() <= 1e-5 * scale
        assert (fast.values - fast.corrupted_value).abs().max() > 1e-3
    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
        ref = _tl_on_layers(model, tlp.get_act_patch_resid_pre, "resid_pre", corrupted, cache,
                            (7,), metric=lambda lg: lg[0, -1, 100] - lg[0, -1, 200])
    res = activation_patch(model, clean, corrupted, parse_site("resid_pre", layers=(7,)), metric)
    assert (res.values - ref.double()).abs().max() <= 1e-4


def test_batching_weighs_block_calls_against_recomputed_tokens(llama_tiny):
    """The batching's cost model: free block calls give one start position per forward group
    (no token computed twice); expensive ones merge positions into forwards from position 0;
    the sweep is the same either way."""
    from mechsink.patching import plan

    clean, corrupted = _pair(llama_tiny)
    site = parse_site("resid_pre")
    results, starts = {}, {}
    for cost in (0, 10**9):
        seen: list[int] = []
        old = plan.BLOCK_CALL_COST, plan.MAX_RECOMPUTE
        plan.BLOCK_CALL_COST, plan.MAX_RECOMPUTE = cost, 100.0
        try:
            def spy(act, hook, seen=seen):
                seen.append(act.shape[1])

            with llama_tiny.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", spy)]):
                results[cost] = activation_patch(llama_tiny, clean, corrupted, site,
                                                 LogitDiff(100, 200)).values
        finally:
            plan.BLOCK_CALL_COST, plan.MAX_RECOMPUTE = old
        starts[cost] = seen
    n = clean.shape[1]
    assert sorted(set(starts[0])) == list(range(1, n + 1))  # one suffix length per position
    assert set(starts[10**9]) == {n}  # every forward from position 0
    assert len(starts[10**9]) < len(starts[0])
    assert (results[0] - results[10**9]).abs().max() <= 1e-5


@pytest.mark.parametrize("ablation", [None, "position_mean"])
def test_a_metric_read_at_layer_0_runs_and_records_nothing_after_it(tiny, ablation):
    """SinkScore(0) reads block 0 only: the recorded runs and every patched forward end after
    block 0 (no block-1 hook fires), layer-1 patches get the unpatched value, and layer-0
    patches equal a full forward per patch with TransformerLens-style hooks."""
    clean, corrupted = _pair(tiny)
    fired: list[int] = []
    with tiny.hooks(fwd_hooks=[("blocks.1.hook_resid_pre",
                                lambda act, hook: fired.append(act.shape[0]))]):
        res = activation_patch(tiny, clean, corrupted, "resid_pre", SinkScore(0),
                               ablation=ablation, direction="noise" if ablation else "denoise")
    assert fired == []
    run = clean if ablation else corrupted
    run_value = res.clean_value if ablation else res.corrupted_value
    assert (res.values[1] == run_value).all()
    _, src_cache = tiny.run_with_cache(clean)
    for pos in range(clean.shape[1]):
        def hook(act, hook, pos=pos):
            if ablation:  # the mean over the other positions of the run's own residual
                others = [q for q in range(act.shape[1]) if q != pos]
                act[:, pos] = act[:, others].mean(1)
            else:
                act[:, pos] = src_cache["blocks.0.hook_resid_pre"][:, pos]
            return act

        with torch.no_grad(), tiny.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", hook)]):
            _, c = tiny.run_with_cache(run)
        pattern = c["blocks.0.attn.hook_pattern"]
        expected = pattern[:, :, :, 0].mean()  # Gu et al.'s score: every query, self included
        assert abs(res.values[0, pos].item() - expected.item()) <= 1e-5
