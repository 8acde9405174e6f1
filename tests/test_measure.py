"""Each measurement against an independent computation: transformers' own attention weights,
numpy, explicit loops, and hand-built tensors with planted outliers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.inputs.prompts import make_prompts
from mechsink.measure import (
    MassiveReport,
    MlpSpikes,
    find_massive,
    first_token_norm_ratio,
    head_output_norms,
    key_bias_cosine,
    massive_activations,
    mlp_spikes,
    sink_rate,
    sink_scores,
    value_drain,
    variance_stats,
)
from mechsink.measure.massive import abs_median, layer_magnitudes
from mechsink.measure.variance import VarianceStats
from mechsink.model import down_projection, head_output_weights

MODELS = ["gpt2_tiny", "llama_tiny"]
SPECS = {"gpt2_tiny": "gpt2-tiny", "llama_tiny": "llama-tiny"}  # conftest fixtures use seed 0


def _cache(model, tokens, suffixes):
    names = [f"blocks.{layer}.{s}" for s in suffixes for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
    return cache


def _as_cache(suffix: str, stacked: torch.Tensor) -> dict[str, torch.Tensor]:
    return {f"blocks.{layer}.{suffix}": stacked[layer] for layer in range(stacked.shape[0])}


# --- sink score: against transformers' own eager attention ---------------------------------------


@pytest.mark.parametrize("fixture", MODELS)
def test_sink_scores_match_transformers_attentions(fixture, request):
    model = request.getfixturevalue(fixture)
    tokens = make_prompts(model, "random", "bos", n=3, seq_len=12, seed=1).tokens
    scores = sink_scores(_cache(model, tokens, ["attn.hook_pattern"]), eps=0.3)
    # Independent: a plain transformers model built from the same seed (no bridge, no hooks).
    from mechsink.model.zoo import random_hf_model

    plain, _ = random_hf_model(SPECS[fixture], seed=0)
    with torch.no_grad():
        out = plain(tokens, output_attentions=True)
    assert len(out.attentions) == model.cfg.n_layers
    # Independent: loop over queries by hand on transformers' attention weights.
    attn = np.stack([a.double().numpy() for a in out.attentions], axis=1)  # [b, l, h, q, k]
    t = attn.shape[-1]
    gu = sum(attn[..., i, 0] for i in range(t)) / t
    no_self = sum(attn[..., i, 0] for i in range(1, t)) / (t - 1)
    np.testing.assert_allclose(scores.gu.numpy(), gu, atol=1e-5, rtol=0)
    np.testing.assert_allclose(scores.no_self.numpy(), no_self, atol=1e-5, rtol=0)
    assert scores.rate == pytest.approx(float((gu > 0.3).mean()))
    assert scores.rate_no_self == pytest.approx(float((no_self > 0.3).mean()))


def test_sink_scores_other_key_position(llama_tiny):
    tokens = make_prompts(llama_tiny, "random", "nobos", n=2, seq_len=10, seed=3).tokens
    cache = _cache(llama_tiny, tokens, ["attn.hook_pattern"])
    scores = sink_scores(cache, position=4)
    pattern = cache["blocks.1.attn.hook_pattern"]
    expected = pattern[:, :, 4:, 4].mean(-1)
    torch.testing.assert_close(scores.gu[:, 1], expected.float(), atol=1e-6, rtol=0)
    torch.testing.assert_close(scores.no_self[:, 1], pattern[:, :, 5:, 4].mean(-1).float(),
                               atol=1e-6, rtol=0)


@pytest.mark.parametrize("eps", [0.0, 1.0, -0.2, 1.5])
def test_eps_outside_unit_interval_is_rejected(eps):
    with pytest.raises(BadInputError, match="eps"):
        sink_rate(torch.zeros(1, 2, 2), eps)


def test_sink_scores_merge_equals_one_pass(gpt2_tiny):
    tokens = make_prompts(gpt2_tiny, "natural", "bos", n=4, seq_len=8).tokens
    whole = sink_scores(_cache(gpt2_tiny, tokens, ["attn.hook_pattern"]))
    parts = [sink_scores(_cache(gpt2_tiny, tokens[i:i + 2], ["attn.hook_pattern"]))
             for i in (0, 2)]
    merged = type(whole).merge(parts)
    torch.testing.assert_close(merged.gu, whole.gu, atol=1e-6, rtol=0)
    assert merged.rate == whole.rate


# --- massive activations: planted outliers ------------------------------------------------------


def _planted_resid() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    resid = torch.rand(3, 2, 5, 64, generator=gen) * 0.09 + 0.01  # |x| in [0.01, 0.1]
    resid[1, 0, 0, 7] = 500.0  # massive: > 100 and > 1000 x median (~0.055)
    resid[2, 1, 3, 11] = -2000.0  # massive, negative
    resid[0, 1, 2, 3] = 90.0  # large ratio but not > 100: not massive
    resid[2, 0, 4, :] = 1.0  # a loud position...
    resid[2, 0, 4, 9] = 150.0  # ...where 150 < 1000 x its median 1.0: not massive
    return resid


def test_find_massive_finds_exactly_the_planted_entries():
    resid = _planted_resid()
    idx, values, ratios = find_massive(resid, "position")
    assert idx.tolist() == [[1, 0, 0, 7], [2, 1, 3, 11]]
    assert values.tolist() == [500.0, -2000.0]
    med = [np.median(np.abs(resid[1, 0, 0].numpy())), np.median(np.abs(resid[2, 1, 3].numpy()))]
    np.testing.assert_allclose(ratios.numpy(), [500 / med[0], 2000 / med[1]], rtol=1e-5)


def test_layer_median_reference_uses_the_whole_layer():
    resid = _planted_resid()
    # Position 0's own median is inflated: 1000 x 0.3 = 300 > 250, so only the layer median
    # (over all positions and channels, ~0.055) makes this entry massive.
    resid[0, 0, 0, :] = 0.3
    resid[0, 0, 0, 5] = 250.0
    by_pos = find_massive(resid, "position")[0].tolist()
    by_layer = find_massive(resid, "layer")[0].tolist()
    assert [0, 0, 0, 5] not in by_pos
    assert [0, 0, 0, 5] in by_layer
    assert [2, 0, 4, 9] in by_layer  # 150 > 1000 x the layer median (~0.06) as well
    assert by_layer == [[0, 0, 0, 5], [1, 0, 0, 7], [2, 0, 4, 9], [2, 1, 3, 11]]


def test_massive_report_groups_and_merges():
    resid = _planted_resid()
    report = massive_activations(_as_cache("hook_resid_post", resid))
    acts = report.activations()
    assert [(a.layer, a.position, a.channel, a.count) for a in acts] == [(1, 0, 7, 1),
                                                                          (2, 3, 11, 1)]
    halves = [massive_activations(_as_cache("hook_resid_post", resid[:, i:i + 1]))
              for i in (0, 1)]
    merged = MassiveReport.merge(halves)
    assert merged.by_position.index.tolist() == report.by_position.index.tolist()
    torch.testing.assert_close(merged.top3, report.top3)


def test_layer_magnitudes_and_median_match_numpy():
    gen = torch.Generator().manual_seed(1)
    resid = torch.randn(2, 3, 4, 6, generator=gen)
    top3, median = layer_magnitudes(resid)
    for layer in range(2):
        for b in range(3):
            flat = np.sort(np.abs(resid[layer, b].numpy()).ravel())[::-1]
            np.testing.assert_allclose(top3[b, layer].numpy(), flat[:3], rtol=1e-6)
            assert median[b, layer].item() == pytest.approx(float(np.median(flat)), rel=1e-6)
    odd = torch.randn(4, 7, generator=gen)
    np.testing.assert_allclose(abs_median(odd).numpy(), np.median(np.abs(odd.numpy()), -1))


# --- super neurons: planted spikes ---------------------------------------------------------------


def _planted_mlp():
    gen = torch.Generator().manual_seed(2)
    post = torch.rand(4, 2, 4, 32, generator=gen) - 0.5
    out = torch.rand(4, 2, 4, 16, generator=gen) - 0.5
    w_out = torch.randn(4, 32, 16, generator=gen)
    post[1, :, 0, 7] = torch.tensor([300.0, 320.0])  # layer 1: input and output spike at pos 0
    out[1, :, 0, 5] = torch.tensor([800.0, 900.0])
    post[2, 0, 1, 3] = 400.0  # layer 2: input spike only
    out[0, 1, 2, 4] = -75.0  # layer 0: output spike only
    post[3, 0, 1, 9] = 100.0  # layer 3: input and output spike at different positions
    out[3, 0, 2, 6] = 100.0
    return post, out, w_out


def test_super_neuron_finder_finds_exactly_the_planted_one():
    post, out, w_out = _planted_mlp()
    cache = {**_as_cache("mlp.hook_post", post), **_as_cache("hook_mlp_out", out)}
    spikes = mlp_spikes(cache, w_out)
    found = spikes.super_neurons()
    assert [(s.layer, s.neuron, s.channel, s.position, s.count) for s in found] == [
        (1, 7, 5, 0, 2)]
    s = found[0]
    assert s.activation == pytest.approx(310.0)
    assert s.weight == pytest.approx(float(w_out[1, 7, 5]))
    assert s.contribution == pytest.approx(310.0 * float(w_out[1, 7, 5]), rel=1e-5)
    assert s.output == pytest.approx(850.0)
    np.testing.assert_allclose(spikes.in_value.abs().amax(0).numpy()[1:3], [320.0, 400.0])
    merged = MlpSpikes.merge([mlp_spikes({k: v[:1] for k, v in cache.items()}, w_out),
                              mlp_spikes({k: v[1:] for k, v in cache.items()}, w_out)])
    assert [(x.layer, x.neuron, x.channel, x.count) for x in merged.super_neurons()] == [
        (1, 7, 5, 2)]


@pytest.mark.parametrize("fixture", MODELS)
def test_down_projection_links_post_to_mlp_out(fixture, request):
    model = request.getfixturevalue(fixture)
    tokens = make_prompts(model, "random", "bos", n=2, seq_len=6).tokens
    cache = _cache(model, tokens, ["mlp.hook_post", "hook_mlp_out"])
    w_out = down_projection(model)
    for layer in range(model.cfg.n_layers):
        expected = cache[f"blocks.{layer}.mlp.hook_post"] @ w_out[layer]
        bias = getattr(model.blocks[layer].mlp, "b_out", None)
        if bias is not None:
            expected = expected + bias
        torch.testing.assert_close(expected, cache[f"blocks.{layer}.hook_mlp_out"],
                                   atol=1e-5, rtol=1e-5)


# --- norms, value drain, head outputs, key-bias cosine ---------------------------------------


def test_first_token_norm_ratio_matches_numpy():
    gen = torch.Generator().manual_seed(3)
    resid = torch.randn(2, 3, 5, 8, generator=gen)
    resid[:, :, 0] *= 10
    got = first_token_norm_ratio(_as_cache("hook_resid_post", resid)).values
    n = np.linalg.norm(resid.numpy(), axis=-1)  # [layer, batch, pos]
    expected = (n[..., 0] / n[..., 1:].mean(-1)).T
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5)


def test_value_drain_is_per_kv_head():
    gen = torch.Generator().manual_seed(4)
    v = torch.randn(2, 3, 6, 2, 4, generator=gen)  # [layer, batch, pos, kv_head, d_head]
    v[1, :, 0, 1] *= 0.01
    got = value_drain(_as_cache("attn.hook_v", v)).values  # [batch, layer, kv_head]
    assert got.shape == (3, 2, 2)
    for layer in range(2):
        for b in range(3):
            for h in range(2):
                norms = [float(np.linalg.norm(v[layer, b, p, h].numpy())) for p in range(6)]
                assert got[b, layer, h].item() == pytest.approx(norms[0] / np.mean(norms[1:]),
                                                                rel=1e-5)
    assert got[:, 1, 1].max() < 0.05


@pytest.mark.parametrize("fixture", MODELS)
def test_head_output_norms_sum_to_attn_out(fixture, request):
    model = request.getfixturevalue(fixture)
    tokens = make_prompts(model, "random", "bos", n=2, seq_len=6).tokens
    cache = _cache(model, tokens, ["attn.hook_z", "hook_attn_out"])
    w_o = head_output_weights(model)
    for layer in range(model.cfg.n_layers):
        z = cache[f"blocks.{layer}.attn.hook_z"]
        heads = torch.einsum("bphd,hdm->bphm", z, w_o[layer])
        total = heads.sum(2)
        bias = getattr(model.blocks[layer].attn, "b_O", None)
        if bias is not None:
            total = total + bias
        torch.testing.assert_close(total, cache[f"blocks.{layer}.hook_attn_out"],
                                   atol=1e-5, rtol=1e-5)
    norms = head_output_norms(cache, w_o).norms
    z0 = cache["blocks.0.attn.hook_z"][1, :, 2]  # sequence 1, head 2
    expected = torch.stack([(z0[p] @ w_o[0, 2]).norm() for p in range(6)]).mean()
    assert norms[1, 0, 2].item() == pytest.approx(expected.item(), rel=1e-5)


def test_dormant_heads_are_those_far_below_the_layer_median():
    norms = torch.tensor([[[1.0, 1.0, 0.05, 2.0], [1.0, 1.0, 1.0, 1.0]]])
    from mechsink.measure import HeadNorms

    assert [(d["layer"], d["head"]) for d in HeadNorms(norms).dormant()] == [(0, 2)]


def test_key_bias_cosine_matches_explicit_loops():
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 5, 4, 3, generator=gen)  # [layer, batch, pos, head, d]
    k = torch.randn(1, 2, 5, 2, 3, generator=gen)  # 2 KV heads shared by 4 query heads
    cache = {**_as_cache("attn.hook_rot_q", q), **_as_cache("attn.hook_rot_k", k)}
    got = key_bias_cosine(cache)

    def cos(a, b):
        return float(a @ b / (a.norm() * b.norm()))

    for b in range(2):
        for h in range(4):
            kv = h // 2
            first = np.mean([cos(q[0, b, i, h], k[0, b, 0, kv]) for i in range(1, 5)])
            rest = np.mean([np.mean([cos(q[0, b, i, h], k[0, b, j, kv]) for j in range(1, i + 1)])
                            for i in range(1, 5)])
            assert got.first[b, 0, h].item() == pytest.approx(first, abs=1e-5)
            assert got.rest[b, 0, h].item() == pytest.approx(rest, abs=1e-5)


# --- variance discrepancy ---------------------------------------------------------------------


def test_variance_matches_numpy_and_merges_exactly():
    gen = torch.Generator().manual_seed(6)
    out = torch.randn(2, 6, 4, 5, generator=gen, dtype=torch.float64)  # [layer, batch, pos, d]
    out[:, :, 0] *= 3
    pattern = torch.softmax(torch.randn(2, 6, 3, 4, 4, generator=gen, dtype=torch.float64), -1)
    pattern = torch.tril(pattern)
    pattern = pattern / pattern.sum(-1, keepdim=True)

    def cache(sl):
        return {**_as_cache("hook_attn_out", out[:, sl]),
                **_as_cache("attn.hook_pattern", pattern[:, sl])}

    whole = variance_stats(cache(slice(None)))
    merged = VarianceStats.merge([variance_stats(cache(slice(0, 2))),
                                  variance_stats(cache(slice(2, 6)))])
    expected = np.var(out.numpy(), axis=1, ddof=1).mean(-1)  # [layer, pos]
    np.testing.assert_allclose(whole.variance.numpy(), expected, rtol=1e-9)
    np.testing.assert_allclose(merged.variance.numpy(), expected, rtol=1e-9)
    np.testing.assert_allclose(whole.ratio.numpy(), expected[:, 0] / expected[:, 1:].mean(-1))
    conc = (pattern.numpy() ** 2).sum(-1).mean(2).mean(1)  # [layer, pos]
    np.testing.assert_allclose(merged.predicted.numpy(), conc, rtol=1e-9)
    assert np.allclose(conc[:, 0], 1.0)


def test_measurement_on_a_cache_missing_layers_is_a_clear_error():
    cache = {"blocks.1.attn.hook_pattern": torch.ones(1, 1, 2, 2)}
    with pytest.raises(BadInputError, match="every layer"):
        sink_scores(cache)
    with pytest.raises(BadInputError, match="names_filter"):
        massive_activations(cache)


# --- the one forward: measure_forward -----------------------------------------------------------


def test_measure_forward_caches_only_what_is_asked_and_chunks_change_nothing(llama_tiny):
    """Against one plain forward of every sequence with the hooks named by hand: the same sink
    scores and residual values however the batch is chunked, and no other hook in the cache."""
    import torch.nn.functional as F

    from mechsink.measure.forward import Measurement, first_chunk, measure_forward, of_cache
    from mechsink.measure.loss import NEXT_TOKEN_LOSS

    tokens = make_prompts(llama_tiny, "natural", "bos", n=5, seq_len=10, seed=2).tokens
    n_layers = llama_tiny.cfg.n_layers
    with torch.no_grad():
        logits, cache = llama_tiny.run_with_cache(tokens)
    direct = sink_scores({k: v for k, v in cache.items() if k.endswith("attn.hook_pattern")})
    wanted = {"sinks": of_cache(("attn.hook_pattern",), sink_scores),
              "resid": of_cache(("hook_resid_post",),
                                lambda c: c["blocks.1.hook_resid_post"][:, 0]),
              "seen": Measurement(("hook_mlp_out",), lambda f: sorted(f.cache.keys()), first_chunk),
              "logits": Measurement((), lambda f: f.logits is None, first_chunk),
              "loss": NEXT_TOKEN_LOSS}
    for batch_size in (None, 2, 5):
        got = measure_forward(llama_tiny, tokens, wanted, batch_size=batch_size)
        torch.testing.assert_close(got["sinks"].gu, direct.gu, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(got["resid"], cache["blocks.1.hook_resid_post"][:, 0])
        asked = {f"blocks.{layer}.{s}" for layer in range(n_layers) for s in
                 ("attn.hook_pattern", "hook_resid_post", "hook_mlp_out")}
        aliases = {f"blocks.{layer}.{s}" for layer in range(n_layers)  # the bridge's own names
                   for s in ("hook_out", "mlp.hook_out")}  # of resid_post and mlp_out
        assert asked <= set(got["seen"]) <= asked | aliases
        assert got["logits"] is False  # the loss asked for them
        ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten(),
                             reduction="none").view(5, 9).mean(1)
        torch.testing.assert_close(got["loss"], ce, atol=1e-5, rtol=1e-5)
    no_logits = measure_forward(llama_tiny, tokens, {"logits": Measurement(
        (), lambda f: f.logits is None, first_chunk)})
    assert no_logits["logits"] is True


@pytest.mark.parametrize("fixture", ["llama_tiny", "gpt2_tiny"])
def test_cache_blocks_stops_before_the_unembedding_with_the_same_activations(fixture, request):
    """The blocks-only run caches what the full run caches, and the final norm and the
    unembedding never run (a hook on their outputs does not fire); no hook is left behind."""
    from mechsink.model import cache_blocks

    model = request.getfixturevalue(fixture)
    tokens = make_prompts(model, "natural", "bos", n=3, seq_len=9, seed=1).tokens
    n_layers = model.cfg.n_layers
    names = [f"blocks.{layer}.{s}" for layer in range(n_layers)
             for s in ("attn.hook_pattern", "hook_resid_post")]
    with torch.no_grad():
        _, full = model.run_with_cache(tokens, names_filter=names)
    fired = []
    late = [h for h in ("ln_final.hook_out", "ln_final.hook_normalized", "unembed.hook_out")
            if h in model.hook_dict]
    assert late
    with torch.no_grad(), model.hooks(fwd_hooks=[(h, lambda a, hook: fired.append(hook.name))
                                                 for h in late]):
        got = cache_blocks(model, tokens, names)
    assert fired == []
    assert set(names) <= set(got)
    for name in names:
        torch.testing.assert_close(got[name], full[name], atol=0, rtol=0)
    assert not any(hp.fwd_hooks for hp in model.hook_dict.values())


def test_measure_forward_bad_input_is_refused_before_the_forward(llama_tiny):
    from mechsink.measure.forward import measure_forward, of_cache

    tokens = make_prompts(llama_tiny, "random", "bos", n=2, seq_len=6).tokens
    one = {"sinks": of_cache(("attn.hook_pattern",), sink_scores)}
    with pytest.raises(BadInputError, match="batch_size"):
        measure_forward(llama_tiny, tokens, one, batch_size=0)
    with pytest.raises(BadInputError, match="at least one measurement"):
        measure_forward(llama_tiny, tokens, {})
    with pytest.raises(BadInputError, match="at least one sequence"):
        measure_forward(llama_tiny, tokens[:0], one)


# --- memory (issue 27 item 1): a cache held once, weights read without a stacked copy ----------


def test_stacked_cache_holds_each_hook_once_and_reads_as_the_plain_cache(llama_tiny):
    from mechsink.measure.cache import StackedCache, n_layers_in, stacked

    tokens = make_prompts(llama_tiny, "random", "bos", n=2, seq_len=8, seed=1).tokens
    suffixes = ("hook_resid_post", "attn.hook_pattern")
    plain = _cache(llama_tiny, tokens, suffixes)
    tensors = {name: plain[name] for name in plain.keys()}
    tensors["blocks.0.alias_of_resid"] = tensors["blocks.0.hook_resid_post"]  # a second name
    tensors["blocks.1.only_one_layer"] = torch.ones(3)
    held = StackedCache.of(tensors, [*suffixes, "only_one_layer"], llama_tiny.cfg.n_layers)
    for s in suffixes:
        one = stacked(held, s)
        assert one is held.stack_of(s)  # no copy: the cache's own tensor
        assert torch.equal(one, torch.stack([plain[f"blocks.{lay}.{s}"] for lay in range(2)]))
        assert held[f"blocks.1.{s}"].data_ptr() == one[1].data_ptr()
    assert "blocks.0.alias_of_resid" not in held.keys()  # dropped with the stacked tensor
    assert torch.equal(held["blocks.1.only_one_layer"], torch.ones(3))  # kept as it was
    with pytest.raises(BadInputError, match="not for every layer"):
        n_layers_in(held, "only_one_layer")
    wanted = {f"blocks.{lay}.{s}" for s in suffixes for lay in range(2)}
    # the bridge's cache also names each tensor by its canonical name (blocks.0.hook_out):
    # those aliases go with the stacked tensor, nothing else is lost
    assert set(held.keys()) == wanted | {"blocks.1.only_one_layer"}
    assert wanted <= set(plain.keys())


@pytest.mark.parametrize("model_name", MODELS)
def test_layer_stack_indexes_like_the_stacked_weights_without_copying(model_name, request):
    from mechsink.measure.layer_stack import LayerStack, down_projection_layers

    model = request.getfixturevalue(model_name)
    full = down_projection(model)  # the stacked copy
    lazy = down_projection_layers(model)
    assert isinstance(lazy, LayerStack) and lazy.shape == full.shape and lazy.ndim == 3
    hf_ptrs = {p.untyped_storage().data_ptr() for p in model.original_model.parameters()}
    assert all(t.untyped_storage().data_ptr() in hf_ptrs for t in lazy._layers)  # views
    assert lazy.detach().to("cpu", torch.float32).cpu() is not None
    g = torch.Generator().manual_seed(0)
    n_layers, rows, cols = full.shape
    li, ri, ci = (torch.randint(k, (3, 5), generator=g) for k in (n_layers, rows, cols))
    assert torch.equal(lazy[li, ri, ci], full[li, ri, ci])
    assert torch.equal(lazy[1, 2, ci[0]], full[1, 2, ci[0]])
    assert torch.equal(lazy[1, :, 3], full[1, :, 3]) and torch.equal(lazy[0], full[0])
    assert torch.equal(lazy[torch.tensor(1)], full[1])
    assert torch.equal(lazy[:, 0], full[:, 0])  # any other index: on the stacked tensor
    assert torch.equal(torch.einsum("lab->l", lazy), full.sum((1, 2)))  # torch functions too
    assert torch.equal(lazy.sum(), full.sum()) and torch.equal(lazy * 2, full * 2)
    assert torch.equal(lazy.float()[1], full[1])
    with pytest.raises(IndexError):
        lazy[torch.tensor([n_layers]), torch.tensor([0]), torch.tensor([0])]
    with pytest.raises(BadInputError, match="one shape"):
        LayerStack([torch.zeros(2), torch.zeros(3)])


@pytest.mark.parametrize("model_name", MODELS)
def test_head_output_layers_are_the_stacked_w_o_without_copying(model_name, request):
    """The census reads W_O one layer at a time from the blocks' own tensors (the stacked
    ``model.W_O`` is a copy: 1 GiB on Llama-3-8B's shapes in bfloat16); head norms agree."""
    from mechsink.measure.layer_stack import LayerStack, head_output_layers
    from mechsink.model.weights import head_output_weights

    model = request.getfixturevalue(model_name)
    full = head_output_weights(model)
    lazy = head_output_layers(model)
    assert isinstance(lazy, LayerStack) and lazy.shape == full.shape
    hf_ptrs = {p.untyped_storage().data_ptr() for p in model.original_model.parameters()}
    assert all(t.untyped_storage().data_ptr() in hf_ptrs for t in lazy._layers)  # views
    for layer in range(full.shape[0]):
        assert torch.equal(lazy[layer], full[layer])
    tokens = torch.randint(0, int(model.cfg.d_vocab), (2, 6), generator=torch.Generator()
                           .manual_seed(0))
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("attn.hook_z"))
    assert torch.equal(head_output_norms(cache, lazy).norms, head_output_norms(cache, full).norms)


def test_next_token_loss_in_row_chunks_equals_one_cross_entropy():
    """The loss is computed a few sequences at a time (memory); every sequence's value must be
    what one cross-entropy over the whole batch gives, for a batch that is not a multiple."""
    import torch.nn.functional as F

    from mechsink.measure.loss import LOSS_ROWS, next_token_loss

    gen = torch.Generator().manual_seed(0)
    rows = 2 * LOSS_ROWS + 3
    logits = torch.randn(rows, 7, 11, generator=gen)
    tokens = torch.randint(0, 11, (rows, 7), generator=gen)
    want = F.cross_entropy(logits[:, :-1].reshape(-1, 11), tokens[:, 1:].reshape(-1),
                           reduction="none").view(rows, 6).mean(1)
    torch.testing.assert_close(next_token_loss(tokens, logits), want)
