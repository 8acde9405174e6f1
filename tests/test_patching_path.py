"""Path patching: identities with activation patching, a planted circuit, normalisation scales."""

from __future__ import annotations

import pytest
import torch

from mechsink import load_model
from mechsink.errors import BadInputError
from mechsink.model import hf_model_of, to_tokens
from mechsink.patching import activation_patch
from mechsink.patching.path import parse_component, parse_receiver, path_patch

CLEAN = "When Mary and John went"
CORRUPTED = "When Tom and John went"


def logit_metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[0, -1, 100] - logits[0, -1, 200]


def test_layer_names_with_many_digits():
    assert parse_component("L12H3").layer == 12
    assert parse_component("L123N4567").index == 4567
    assert parse_receiver("L10H11.v").layer == 10
    r = parse_receiver("resid17@-1:300")
    assert (r.layer, r.position, r.index) == (17, -1, 300)  # a resid receiver's unit: a channel
    with pytest.raises(BadInputError, match="unknown sender"):
        parse_component("layer3head2")


def test_whole_residual_stream_sender_equals_activation_patch(llama_tiny):
    """Senders = every writer of the residual at (layer, pos), receiver = that residual:
    the path patch is the (noising) activation patch of resid_pre at (layer, pos)."""
    clean = to_tokens(llama_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(llama_tiny, CORRUPTED, prepend_bos=True)
    act = activation_patch(llama_tiny, clean, corrupted, "resid_pre", logit_metric,
                           direction="noise")
    n_heads = llama_tiny.cfg.n_heads
    for layer in (1,):
        for pos in range(clean.shape[1]):
            group = [f"embed@{pos}"] + [f"L{lyr}H{h}@{pos}" for lyr in range(layer)
                                        for h in range(n_heads)] + [
                f"MLP{lyr}@{pos}" for lyr in range(layer)]
            res = path_patch(llama_tiny, clean, corrupted, [group], [f"resid{layer}@{pos}"],
                             logit_metric)
            assert abs(res.values[0].item() - act.values[layer, pos].item()) <= 1e-4


def test_all_senders_to_metric_equals_corrupted_run(gpt2_tiny):
    clean = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(gpt2_tiny, CORRUPTED, prepend_bos=True)
    group = ["embed"] + [f"L{lyr}H{h}" for lyr in range(2) for h in range(4)] + ["MLP0", "MLP1"]
    res = path_patch(gpt2_tiny, clean, corrupted, [group], ["metric"], logit_metric)
    assert abs(res.values[0].item() - res.corrupted_value) <= 1e-4


@pytest.fixture(scope="module")
def planted():
    """llama-tiny rewired so that L0H0 -> L1H0 (value) -> logits is the only path through
    L1H0, and L0H1 (a decoy sharing L0H0's value head) reaches the logits only directly.

    Channels: E 0-7 (token embedding), A 16-23 (L0H0 writes), B 24-31 (decoy writes),
    C 32-39 (L1H0 writes). Attention is uniform (W_Q = W_K = 0); MLPs are off.
    """
    model = load_model("random:llama-tiny", device="cpu", seed=1)
    hf = hf_model_of(model)
    g = torch.Generator().manual_seed(0)
    eye = torch.eye(8)
    with torch.no_grad():
        emb = hf.model.embed_tokens.weight
        emb.zero_()
        emb[:, 0:8] = torch.randn(emb.shape[0], 8, generator=g)
        for layer in hf.model.layers:
            for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                      layer.self_attn.o_proj, layer.mlp.down_proj):
                p.weight.zero_()
        a0, a1 = hf.model.layers[0].self_attn, hf.model.layers[1].self_attn
        a0.v_proj.weight[0:8, 0:8] = eye           # KV head 0 reads E
        a0.o_proj.weight[16:24, 0:8] = eye         # head 0 writes A
        a0.o_proj.weight[24:32, 16:24] = eye       # head 1 (decoy) writes B
        a1.v_proj.weight[0:8, 16:24] = eye         # L1 KV head 0 reads A
        a1.o_proj.weight[32:40, 0:8] = 3 * eye     # L1H0 writes C
        hf.lm_head.weight.zero_()
        hf.lm_head.weight[:, 24:40] = torch.randn(hf.lm_head.weight.shape[0], 16, generator=g)
    return model


def test_planted_circuit_is_recovered_and_decoy_is_not(planted):
    clean = to_tokens(planted, CLEAN, prepend_bos=True)
    corrupted = to_tokens(planted, CORRUPTED, prepend_bos=True)
    act = activation_patch(planted, clean, corrupted, "z_all_pos", logit_metric,
                           direction="noise")
    effect = act.values - act.clean_value
    assert abs(effect[0, 0]) > 1e-2 and abs(effect[0, 1]) > 1e-2  # both matter in total
    res = path_patch(planted, clean, corrupted, ["L0H0", "L0H1", "L0H2"], ["L1H0.v"],
                     logit_metric, scales="frozen")
    path = res.values - res.clean_value
    assert abs(path[0]) > 1e-2          # the planted path
    assert abs(path[1]) <= 1e-6         # the decoy reaches the logits, but not through L1H0
    assert abs(path[2]) <= 1e-6         # a dead head
    direct = path_patch(planted, clean, corrupted, ["L0H0", "L0H1"], ["metric"], logit_metric,
                        scales="frozen")
    d = direct.values - direct.clean_value
    assert abs(d[0]) <= 1e-6 and abs(d[1]) > 1e-2  # the decoy's effect is direct


def test_recomputed_scales_leak_through_the_norm(planted):
    """With recomputed RMSNorm scales the decoy moves L1's input scale: a small nonzero path."""
    clean = to_tokens(planted, CLEAN, prepend_bos=True)
    corrupted = to_tokens(planted, CORRUPTED, prepend_bos=True)
    frozen = path_patch(planted, clean, corrupted, ["L0H1"], ["L1H0.v"], logit_metric,
                        scales="frozen")
    recomputed = path_patch(planted, clean, corrupted, ["L0H1"], ["L1H0.v"], logit_metric,
                            scales="recomputed")
    assert abs(frozen.values[0] - frozen.clean_value) <= 1e-6
    assert abs(recomputed.values[0] - recomputed.clean_value) > 1e-6


def test_path_bad_input(gpt2_tiny):
    clean = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    with pytest.raises(BadInputError, match="layer 5"):
        path_patch(gpt2_tiny, clean, clean, ["L5H0"], ["metric"], logit_metric)
    with pytest.raises(BadInputError, match="scales"):
        path_patch(gpt2_tiny, clean, clean, ["L0H0"], ["metric"], logit_metric, scales="x")


def test_path_patch_leaves_no_hooks_when_metric_raises(gpt2_tiny):
    clean = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(gpt2_tiny, CORRUPTED, prepend_bos=True)
    with torch.no_grad():
        before = gpt2_tiny(clean)
    calls = {"n": 0}

    def flaky(lg):
        calls["n"] += 1
        if calls["n"] > 2:
            raise RuntimeError("boom")
        return lg[0, -1, 0]

    with pytest.raises(RuntimeError, match="boom"):
        path_patch(gpt2_tiny, clean, corrupted, ["L0H0", "L0H1"], ["L1H0.q"], flaky)
    with torch.no_grad():
        assert torch.equal(before, gpt2_tiny(clean))
    assert all(not hp.fwd_hooks for hp in gpt2_tiny.hook_dict.values())


def _hooked_value(model, tokens, hook_name, replace):
    """The logit metric with one activation edited by a plain TransformerLens hook."""
    def hook(act, hook):
        return replace(act.clone())

    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[(hook_name, hook)])
    return logit_metric(logits).item()


@pytest.mark.parametrize("ablation", ["zero", "batch_mean", "position_mean"])
def test_ablation_of_the_last_mlp_equals_a_plain_hook(gpt2_tiny, ablation):
    """Nothing is downstream of the last MLP, so its path patch to the metric is the plain
    ablation of its output at position 0, computed here with one run_with_hooks."""
    tokens = to_tokens(gpt2_tiny, ["When Mary and John went", "The cat sat on the mat"],
                       prepend_bos=True, seq_len=6)
    last = gpt2_tiny.cfg.n_layers - 1

    def replace(act):
        if ablation == "zero":
            act[:, 0] = 0
        elif ablation == "batch_mean":
            act[:, 0] = act[:, 0].mean(0, keepdim=True)
        else:
            act[:, 0] = act[:, 1:].mean(1)
        return act

    expected = _hooked_value(gpt2_tiny, tokens, f"blocks.{last}.hook_mlp_out", replace)
    res = path_patch(gpt2_tiny, tokens, None, [f"MLP{last}@0"], ["metric"], logit_metric,
                     ablation=ablation)
    assert res.corrupted_value is None
    assert res.meta["ablation"] == ablation
    assert abs(res.values[0].item() - expected) <= 1e-4


def test_position_mean_of_a_last_layer_head_equals_a_plain_hook(llama_tiny):
    """L1H1 is in the last layer (llama-tiny has two), so its path to the metric is the plain
    ablation of its z at position 0 by its mean over the later positions."""
    tokens = to_tokens(llama_tiny, CLEAN, prepend_bos=True)
    res = path_patch(llama_tiny, tokens, None, ["L1H1@0"], ["metric"], logit_metric,
                     ablation="position_mean")

    def replace(act):
        act[:, 0, 1] = act[:, 1:, 1].mean(1)
        return act

    expected = _hooked_value(llama_tiny, tokens, "blocks.1.attn.hook_z", replace)
    assert abs(res.values[0].item() - expected) <= 1e-4


def test_ablation_bad_input(gpt2_tiny):
    tokens = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    with pytest.raises(BadInputError, match="either a corrupted input or an ablation"):
        path_patch(gpt2_tiny, tokens, tokens, ["L0H0"], ["metric"], logit_metric,
                   ablation="zero")
    with pytest.raises(BadInputError, match="either a corrupted input or an ablation"):
        path_patch(gpt2_tiny, tokens, None, ["L0H0"], ["metric"], logit_metric)
    with pytest.raises(BadInputError, match="unknown ablation 'median'"):
        path_patch(gpt2_tiny, tokens, None, ["L0H0"], ["metric"], logit_metric,
                   ablation="median")


def test_several_metrics_share_one_run_and_equal_separate_runs(gpt2_tiny):
    from mechsink.patching import MassiveValue, SinkScore

    tokens = to_tokens(gpt2_tiny, ["When Mary and John went", "The cat sat on the mat"],
                       prepend_bos=True, seq_len=6)
    senders = ["L0H0@0", "L0H1@0", "MLP0@0"]
    metrics = [SinkScore(1), MassiveValue(1, 0, 3)]
    calls = {"n": 0}

    def count(act, hook):
        calls["n"] += 1

    with gpt2_tiny.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", count)]):
        both = path_patch(gpt2_tiny, tokens, None, senders, ["MLP1"], metrics,
                          ablation="position_mean")
    shared = calls["n"]
    for m, res in zip(metrics, both, strict=True):
        alone = path_patch(gpt2_tiny, tokens, None, senders, ["MLP1"], m,
                           ablation="position_mean")
        assert res.metric == m.name and res.clean_value == pytest.approx(alone.clean_value)
        assert (res.values - alone.values).abs().max() <= 1e-6
    assert (both[1].values - both[1].clean_value).abs().max() > 1e-4
    calls["n"] = 0
    with gpt2_tiny.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", count)]):
        path_patch(gpt2_tiny, tokens, None, senders, ["MLP1"], metrics[0],
                   ablation="position_mean")
    assert shared == calls["n"]  # two metrics cost the forwards of one


def test_batch_size_zero_and_whole_senders_fail_before_any_forward(gpt2_tiny):
    tokens = to_tokens(gpt2_tiny, CLEAN, prepend_bos=True)
    calls = {"n": 0}

    def count(act, hook):
        calls["n"] += 1

    with gpt2_tiny.hooks(fwd_hooks=[("hook_embed", count)]):
        with pytest.raises(BadInputError, match="batch_size must be a positive integer"):
            path_patch(gpt2_tiny, tokens, tokens, ["L0H0"], ["metric"], logit_metric,
                       batch_size=0)
        with pytest.raises(BadInputError, match=r"give each sender a position \(e.g. L0H0@0\)"):
            path_patch(gpt2_tiny, tokens, None, ["L0H0"], ["metric"], logit_metric,
                       ablation="position_mean")
    assert calls["n"] == 0


@pytest.mark.parametrize("batch_size", [1, 2, None])
def test_batch_size_does_not_change_path_values(llama_tiny, batch_size):
    clean = to_tokens(llama_tiny, CLEAN, prepend_bos=True)
    corrupted = to_tokens(llama_tiny, CORRUPTED, prepend_bos=True)
    senders = ["L0H0", "L0H3@2", "MLP0", ["embed@1", "L0N5"]]
    ref = path_patch(llama_tiny, clean, corrupted, senders, ["L1H2.k"], logit_metric,
                     batch_size=16)
    got = path_patch(llama_tiny, clean, corrupted, senders, ["L1H2.k"], logit_metric,
                     batch_size=batch_size)
    assert (got.values - ref.values).abs().max() <= 1e-5
    assert (ref.values - ref.clean_value).abs().max() > 1e-4


def test_gpt2_senders_of_one_layer_share_a_batch_of_one_prompt():
    """#29 item 7: on a GPT-2 model with one prompt, two senders of a layer in one batch fed
    transformers' Conv1D a stride-0 tensor ("view size is not compatible"). Each sender in a
    batch of its own is the reference."""
    model = load_model("organism:bb-gpt2-tiny", device="cpu")
    tokens = torch.randint(1, int(model.cfg.d_vocab), (1, 6), generator=torch.Generator()
                           .manual_seed(0))
    senders = ["L0H0", "L0H1", "L0N1", "L0N2", "MLP0"]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1].logsumexp(-1)

    for receivers in (["metric"], ["MLP1"]):
        got = path_patch(model, tokens, None, senders, receivers, metric,
                         ablation="zero")  # the default batch size
        alone = path_patch(model, tokens, None, senders, receivers, metric,
                           ablation="zero", batch_size=1)
        assert (got.values - alone.values).abs().max() <= 1e-5
        assert (got.values - got.clean_value).abs().max() > 1e-6
