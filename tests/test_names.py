"""One vocabulary: every name form resolves to TransformerLens's own hook, one table of kinds
under sites, path-patching nodes, discovery receivers and ablate, a head's key named the same
way everywhere on GQA models, removed spellings refused (the ones still kept warn and agree),
the sink-score default is the same everywhere, results frame."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformer_lens.utilities import get_act_name

from mechsink.errors import BadInputError
from mechsink.interventions.edits import ablate, applied, attend_only_to_self
from mechsink.interventions.readout import dominant_super_neuron, massive_channel_sets, sink_readout
from mechsink.measure import sink_score, sink_scores
from mechsink.model import to_tokens
from mechsink.names import parse_name
from mechsink.patching import Site, activation_patch, attribution_patch, parse_site, path_patch
from mechsink.patching.metrics import SinkScore

CLEAN = "When Mary and John went"
CORRUPTED = "When Tom and John went"


def logit_metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[0, -1, 100] - logits[0, -1, 200]


# form -> get_act_name's arguments for the same hook (the independent reference)
FORMS = [
    ("blocks.1.attn.hook_z", ("z", 1)),
    (("z", 1), ("z", 1)),
    (("k", 1, "attn"), ("k", 1)),
    ("k1", ("k", 1)),
    ("pre0", ("pre", 0)),
    ("scale1ln2", ("scale", 1, "ln2")),
    ("blocks.0.ln1.hook_scale", ("scale", 0, "ln1")),
    ("L1H2", ("z", 1)),
    ("L1H2.q", ("q", 1)),
    ("L1H2.pattern", ("pattern", 1)),
    ("L0N17@3", ("post", 0)),
    ("MLP1@0", ("mlp_out", 1)),
    ("ATTN0", ("attn_out", 0)),
    ("resid1@0:5", ("resid_pre", 1)),
    ("resid_post0", ("resid_post", 0)),
    ("hook_embed", ("embed",)),
    ("embed@0", ("embed",)),
]
LAYERLESS = [  # a kind without its layer, + layer=1
    ("z", ("z", 1)), ("attn.hook_z", ("z", 1)), ("hook_mlp_out", ("mlp_out", 1)),
    ("mlp_out", ("mlp_out", 1)), ("mlp.hook_post", ("post", 1)), ("mlp_post", ("post", 1)),
    ("post", ("post", 1)), ("attn", ("pattern", 1)), ("hook_resid_pre", ("resid_pre", 1)),
    ("value", ("v", 1)),
]


@pytest.mark.parametrize(("form", "tl_args"), FORMS)
def test_every_form_names_transformer_lens_own_hook(gpt2_tiny, form, tl_args):
    expected = get_act_name(*tl_args)
    name = parse_name(form)
    assert name.hook == expected
    assert expected in gpt2_tiny.hook_dict
    assert parse_name(str(name)) == name  # the canonical short form reads back as itself
    name.check(gpt2_tiny, seq_len=6)


@pytest.mark.parametrize(("form", "tl_args"), LAYERLESS)
def test_layerless_forms_take_the_layer(gpt2_tiny, form, tl_args):
    assert parse_name(form, layer=1).hook == get_act_name(*tl_args) in gpt2_tiny.hook_dict


def test_units_positions_and_channels_come_from_the_short_form():
    assert (parse_name("L12H3@-1").layer, parse_name("L12H3@-1").unit,
            parse_name("L12H3@-1").position) == (12, 3, -1)
    assert parse_name("L11N1229").unit == 1229
    assert parse_name("resid17@0:300").unit == 300
    for bad in ("layer3head2", "L3X2", "nonsense", "hook_nonsense", "z@", "L3H2:5"):
        with pytest.raises(BadInputError):
            parse_name(bad)
    with pytest.raises(BadInputError, match="give the layer once"):
        parse_name("blocks.2.attn.hook_z", layer=3)


def test_check_refuses_what_the_model_lacks(gpt2_tiny):
    for bad, what in (("L2H0", "layer 2"), ("L0H4", "head 4"), ("L0N9999", "neuron 9999"),
                      ("resid0@9", "position 9"), ("blocks.0.attn.hook_rot_q", "no hook")):
        with pytest.raises(BadInputError, match=what):
            parse_name(bad).check(gpt2_tiny, seq_len=6)


def test_the_table_counts_units_and_names_hooks_as_transformer_lens_does(llama_tiny):
    """Every kind's hook is get_act_name's, and its unit count is the size of that axis in
    the model's own activation (llama-tiny: 4 query heads, 2 KV heads)."""
    from mechsink.discover.graph_run import graph_mode
    from mechsink.names import KINDS, unit_count

    tokens, _ = _tokens(llama_tiny)
    with torch.no_grad(), graph_mode(llama_tiny):
        _, cache = llama_tiny.run_with_cache(tokens)
    unit_dim = {"pattern": 1, "attn_scores": 1}
    seen = 0
    for kind in KINDS.values():
        name = parse_name(kind.hook, layer=None if not kind.in_block else 1)
        assert name.kind == kind.name
        if name.hook not in cache.cache_dict or kind.unit is None:
            continue
        act = cache[name.hook]
        dim = unit_dim.get(kind.name, 2 if act.ndim > 3 or kind.unit == "neuron" else -1)
        assert act.shape[dim] == unit_count(llama_tiny, kind.name), kind.name
        seen += 1
    assert seen >= 15
    assert unit_count(llama_tiny, "k") == 2 and unit_count(llama_tiny, "q") == 4


def test_a_heads_key_is_named_the_same_everywhere_on_gqa(llama_tiny):
    """On llama-tiny (4 query heads, 2 KV heads) ``L1H3.k`` is the key query head 3 reads,
    KV head 1, for patching sites, ablate and path-patching receivers alike, and ``L1KV1.k``
    names that KV head directly (before: sites and ablate read the 3 as a KV head and refused
    it, path_patch read it as a query head)."""
    from mechsink.patching import parse_receiver

    clean, corrupted = _tokens(llama_tiny)
    ref = activation_patch(llama_tiny, clean, corrupted, Site("k", layers=(1,), units=(1,)),
                           logit_metric)
    for form in ("L1H3.k", "L1H2.k", "L1KV1.k"):
        got = activation_patch(llama_tiny, clean, corrupted, form, logit_metric)
        assert got.labels["head"] == [1]
        torch.testing.assert_close(got.values, ref.values)
    expected = None
    for form in ("L1H3.k@2", "L1KV1.k@2", ("attn.hook_k", {"units": [1], "positions": [2]})):
        site, kw = form if isinstance(form, tuple) else (form, {})
        with applied(llama_tiny, [ablate(llama_tiny, site, 1 if kw else None, **kw)]):
            got = llama_tiny(clean)
        if expected is None:
            expected = got
        torch.testing.assert_close(got, expected)
    assert parse_receiver("L1H3.k").index_on(llama_tiny) == 1
    assert parse_receiver("L1KV1.k").index_on(llama_tiny) == 1
    a = path_patch(llama_tiny, clean, corrupted, ["L0H0"], ["L1H3.k"], logit_metric)
    b = path_patch(llama_tiny, clean, corrupted, ["L0H0"], ["L1KV1.k"], logit_metric)
    torch.testing.assert_close(a.values, b.values)
    assert (a.site, b.site) == ("path:L1H3.k", "path:L1KV1.k")
    assert str(parse_name("L1KV1.k")) == "L1KV1.k" and str(parse_name("L1H3.k")) == "L1H3.k"
    with pytest.raises(BadInputError, match="KV head 2 is out of range"):
        parse_name("L1KV2.k").check(llama_tiny)


def test_discovery_receivers_are_path_patching_receivers(llama_tiny):
    """The graph's receivers are the one Receiver: their names parse back to themselves, and
    each reads at the hook of its kind in the table (graph mode) and computes at another."""
    from mechsink.discover import Graph
    from mechsink.names import KINDS
    from mechsink.patching import Receiver, parse_receiver
    from mechsink.patching.nodes import RECEIVERS

    g = Graph.build(llama_tiny, SinkScore(1))
    for r in g.receivers:
        assert isinstance(r, Receiver)
        if r.kind == "metric":
            continue
        back = parse_receiver(r.name)
        assert (back.kind, back.layer, back.index_on(llama_tiny)) == (r.kind, r.layer, r.index)
        read, computes = RECEIVERS[r.kind]
        assert r.read_hook == f"blocks.{r.layer}.{KINDS[read].hook}"
        assert r.hook == get_act_name(computes, r.layer)


def _tokens(model):
    return (to_tokens(model, CLEAN, prepend_bos=True),
            to_tokens(model, CORRUPTED, prepend_bos=True))


def test_every_site_form_patches_the_same_thing(llama_tiny):
    clean, corrupted = _tokens(llama_tiny)
    ref = activation_patch(llama_tiny, clean, corrupted,
                           Site("z", layers=(1,), units=(1,), positions=(2,)), logit_metric)
    for form in ("L1H1@2", "blocks.1.attn.hook_z", ("z", 1), "attn.hook_z", "z"):
        restrict = {} if form == "L1H1@2" else {"units": (1,), "positions": (2,)}
        if form in ("attn.hook_z", "z"):
            restrict["layers"] = (1,)
        got = activation_patch(llama_tiny, clean, corrupted, parse_site(form, **restrict),
                               logit_metric)
        torch.testing.assert_close(got.values, ref.values)
    neuron = parse_site("L0N7")
    assert (neuron.kind, neuron.layers, neuron.units) == ("neuron", (0,), (7,))
    assert parse_site("MLP1_all_pos").kind == "mlp_out"
    with pytest.raises(BadInputError, match="already names its layer"):
        parse_site("blocks.1.attn.hook_z", layers=(0,))


def test_ablate_any_form_equals_a_hand_written_hook(llama_tiny):
    tokens, _ = _tokens(llama_tiny)
    name = get_act_name("z", 1)

    def zero_head(z, hook):
        z = z.clone()
        z[:, 2, 1] = 0.0
        return z

    expected = llama_tiny.run_with_hooks(tokens, fwd_hooks=[(name, zero_head)])
    for edit in (ablate(llama_tiny, "L1H1@2"), ablate(llama_tiny, "attn.hook_z", 1, units=[1],
                                                      positions=[2]),
                 ablate(llama_tiny, ("z", 1), units=[1], positions=[2]),
                 ablate(llama_tiny, "blocks.1.attn.hook_z", units=[1], positions=[2])):
        with applied(llama_tiny, [edit]):
            got = llama_tiny(tokens)
        torch.testing.assert_close(got, expected)
    with pytest.raises(BadInputError, match="give layer="):
        ablate(llama_tiny, "z")
    with pytest.raises(BadInputError, match="already names its unit"):
        ablate(llama_tiny, "L1H1", units=[0])


def test_path_patch_hook_names_equal_short_forms(gpt2_tiny):
    clean, corrupted = _tokens(gpt2_tiny)
    short = path_patch(gpt2_tiny, clean, corrupted, ["MLP0", "ATTN0@2", "L0N3"],
                       [f"L1H{h}.k" for h in range(4)], logit_metric)
    hooks = path_patch(gpt2_tiny, clean, corrupted,
                       ["blocks.0.hook_mlp_out", [f"L0H{h}@2" for h in range(4)], "L0N3"],
                       ["blocks.1.attn.hook_k"], logit_metric)
    torch.testing.assert_close(short.values, hooks.values)
    every = path_patch(gpt2_tiny, clean, corrupted, ["MLP0"], ["blocks.1.hook_resid_pre"],
                       logit_metric)
    resid = path_patch(gpt2_tiny, clean, corrupted, ["MLP0"], ["resid1"], logit_metric)
    torch.testing.assert_close(every.values, resid.values)


def test_denoising_path_patch_of_every_sender_gives_the_clean_run(gpt2_tiny):
    clean, corrupted = _tokens(gpt2_tiny)
    group = ["embed"] + [f"L{lyr}H{h}" for lyr in range(2) for h in range(4)] + ["MLP0", "MLP1"]
    res = path_patch(gpt2_tiny, clean, corrupted, [group], ["metric"], logit_metric,
                     direction="denoise")
    assert abs(res.values[0].item() - res.clean_value) <= 1e-4
    assert res.meta["direction"] == "denoise"
    noise = path_patch(gpt2_tiny, clean, corrupted, [group], ["metric"], logit_metric)
    assert abs(noise.values[0].item() - noise.corrupted_value) <= 1e-4
    assert noise.meta["direction"] == "noise"
    with pytest.raises(BadInputError, match="denoise"):
        path_patch(gpt2_tiny, clean, None, ["MLP0"], ["metric"], logit_metric,
                   ablation="zero", direction="denoise")


def test_denoising_path_patch_of_a_residual_equals_activation_patching(llama_tiny):
    clean, corrupted = _tokens(llama_tiny)
    act = activation_patch(llama_tiny, clean, corrupted, "resid_pre", logit_metric,
                           direction="denoise")
    pos = 3
    group = [f"embed@{pos}"] + [f"L0H{h}@{pos}" for h in range(llama_tiny.cfg.n_heads)] + [
        f"MLP0@{pos}"]
    res = path_patch(llama_tiny, clean, corrupted, [group], [f"resid1@{pos}"], logit_metric,
                     direction="denoise")
    assert abs(res.values[0].item() - act.values[1, pos].item()) <= 1e-4


# --- old spellings: gone, each a clear error ---------------------------------------------


def test_old_site_spellings_are_refused():
    """The spellings of earlier releases are gone: each is a clear error naming the way."""
    for old in ("head", "attn_head", "neurons", "z:all_pos", "z@all", "z_all", "z:pos",
                "resid_pre_pos"):
        with pytest.raises(BadInputError, match="unknown site"):
            parse_site(old)
    for keyword in ("heads", "neurons"):
        with pytest.raises(BadInputError, match="restrict a site with layers=, units="):
            parse_site("z", **{keyword: (1,)})
        with pytest.raises(TypeError, match=keyword):
            Site("z", **{keyword: (1,)})


def test_old_keywords_are_gone(llama_tiny):
    """key_pos=, key_positions= and heads= were renamed before the first release and are not
    accepted any more (position=, positions=, units=)."""
    tokens, _ = _tokens(llama_tiny)
    _, cache = llama_tiny.run_with_cache(tokens)
    pattern = cache[get_act_name("pattern", 1)]
    torch.testing.assert_close(sink_score(pattern, position=2), sink_score(pattern, 2))
    for call in (lambda: sink_score(pattern, key_pos=2),
                 lambda: sink_scores(cache, key_pos=2),
                 lambda: sink_readout(llama_tiny, tokens, key_positions=[0, 2]),
                 lambda: attend_only_to_self(llama_tiny, [1], key_pos=3, heads=[0])):
        with pytest.raises(TypeError):
            call()
    assert not hasattr(sink_scores(cache, position=2), "key_pos")


def test_results_are_dataclasses_without_dict_indexing(llama_tiny):
    tokens, _ = _tokens(llama_tiny)
    sn = dominant_super_neuron(llama_tiny, tokens)
    assert sn.name == f"L{sn.layer}N{sn.neuron}"
    assert list(sn.to_frame()["channel_at_pos0"]) == sn.channel_at_pos0
    found = massive_channel_sets(llama_tiny, tokens)
    assert found.to_dict()["channel"] == found.channel
    for result, key in ((sn, "channel"), (found, "creating_layer")):
        with pytest.raises(TypeError):
            result[key]  # noqa: B018 (the old dict access)


def test_text_without_prepend_bos_is_refused(gpt2_tiny):
    """Text input needs a stated BOS choice (it was a warning meaning True); token tensors
    are used as they are."""
    from mechsink.discover import GraphRun, discover

    calls = [lambda **kw: activation_patch(gpt2_tiny, CLEAN, CORRUPTED, "resid_pre",
                                           logit_metric, **kw),
             lambda **kw: path_patch(gpt2_tiny, CLEAN, CORRUPTED, ["MLP0"], ["metric"],
                                     logit_metric, **kw),
             lambda **kw: attribution_patch(gpt2_tiny, CLEAN, CORRUPTED, "resid_pre",
                                            logit_metric, **kw),
             lambda **kw: GraphRun(gpt2_tiny, CLEAN, SinkScore(1), corrupted=CORRUPTED, **kw),
             lambda **kw: discover(gpt2_tiny, CLEAN, SinkScore(1), corrupted=CORRUPTED,
                                   method="exact", **kw)]
    for call in calls:
        with pytest.raises(BadInputError, match="prepend_bos=True or prepend_bos=False"):
            call()
    a = activation_patch(gpt2_tiny, CLEAN, CORRUPTED, "resid_pre", logit_metric,
                         prepend_bos=True)
    clean, corrupted = _tokens(gpt2_tiny)
    with warnings.catch_warnings():  # token tensors need no BOS answer
        warnings.simplefilter("error")
        b = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", logit_metric)
    torch.testing.assert_close(a.values, b.values)


# --- one sink-score variant --------------------------------------------------------------------


def test_sink_score_default_is_gus_everywhere(llama_tiny):
    """Census, readout, the patching metric and sink_score all default to Gu's score of key 0
    (queries i >= 0), computed here by hand from hook_pattern; include_self=False everywhere
    gives the queries i >= 1."""
    from mechsink.inputs.prompts import make_prompts
    from mechsink.measure.census import census

    tokens = make_prompts(llama_tiny, "natural", "bos", n=2, seq_len=8, seed=0).tokens
    _, cache = llama_tiny.run_with_cache(tokens)
    n_layers = llama_tiny.cfg.n_layers
    pats = [cache[get_act_name("pattern", lay)].double() for lay in range(n_layers)]
    hand = torch.stack([p[:, :, :, 0].sum(-1) / p.shape[-2] for p in pats], 1).mean(0)
    hand_after = torch.stack([p[:, :, 1:, 0].sum(-1) / (p.shape[-2] - 1) for p in pats],
                             1).mean(0)
    c = census(llama_tiny, ["natural"], ["bos"], n=2, seq_len=8, seed=0)
    torch.testing.assert_close(c.runs[0].sinks.mean.double(), hand.float().double())
    readout = sink_readout(llama_tiny, tokens)
    torch.testing.assert_close(readout.scores[0].double(), hand, atol=1e-6, rtol=1e-5)
    after = sink_readout(llama_tiny, tokens, include_self=False)
    torch.testing.assert_close(after.scores[0].double(), hand_after, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(c.runs[0].sinks.score(include_self=False).double(), hand_after,
                               atol=1e-6, rtol=1e-5)
    metric_val = activation_patch(llama_tiny, tokens, tokens, Site("resid_pre", layers=(0,),
                                                                   positions=(0,)),
                                  SinkScore(1, 0)).clean_value
    assert metric_val == pytest.approx(hand[1, 0].item(), abs=1e-5)
    frame = c.runs[0].sinks.to_frame()
    assert len(frame) == n_layers * llama_tiny.cfg.n_heads
    assert frame["sink_score"].tolist() == pytest.approx(hand.flatten().tolist(), abs=1e-5)
