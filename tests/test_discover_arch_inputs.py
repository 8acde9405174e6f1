"""Edge discovery on architectures whose residual stream a receiver does not read plainly
(issue #25): the norm after attention (OLMo 2), bridges whose per-head q/k/v inputs were
broken (MPT: never fired; Bloom: held the normalised input) and a post-LN residual (OpenAI
GPT). Each against an independent computation: transformers' own modules, or the probe on a
bridge with mechsink's patch taken off again."""

from __future__ import annotations

import pytest
import torch

from tests.architectures import builder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """arch -> (its tiny model through ``hf:<folder>``, the plain transformers model)."""
    import transformers

    import mechsink

    root, loaded = tmp_path_factory.mktemp("discover_arch"), {}

    def get(arch: str):
        if arch not in loaded:
            folder = builder.save(arch, root).folder
            assert folder is not None, arch
            hf = transformers.AutoModelForCausalLM.from_pretrained(
                str(folder), attn_implementation="eager").eval()
            loaded[arch] = (mechsink.load_model(f"hf:{folder}", device="cpu"), hf)
        return loaded[arch]

    return get


def _metric(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, 5] - logits[:, -1, 7]).mean()


def _tokens() -> tuple[torch.Tensor, torch.Tensor]:
    clean = torch.tensor(builder.PROBE)[:1]
    corrupted = clean.clone()
    corrupted[:, 1:3] = (corrupted[:, 1:3] + 13) % 60
    return clean, corrupted


def test_an_exact_edge_recomputes_the_norm_after_attention(tiny):
    """OLMo 2 writes ``post_attention_layernorm(attention)``: an exact edge from head 0.1
    adds ``norm(R + dr) - norm(R)``, computed here with transformers' own norm module on the
    attention output projection's input and output (not the bridge's hooks)."""
    from mechsink.discover import GraphRun

    model, hf = tiny("Olmo2ForCausalLM")
    clean, corrupted = _tokens()
    run = GraphRun(model, clean, _metric, corrupted=corrupted)
    layer = hf.model.layers[0]
    d_head = int(model.cfg.d_head)
    seen: dict[str, torch.Tensor] = {}
    handle = layer.self_attn.o_proj.register_forward_hook(
        lambda mod, args, out: seen.update(z=args[0].detach(), out=out.detach()))
    try:
        with torch.no_grad():
            hf(clean)
            z_clean, r = seen["z"], seen["out"]
            hf(corrupted)
            z_corr = seen["z"]
    finally:
        handle.remove()
    w = layer.self_attn.o_proj.weight  # [d_model, heads * d_head]
    cols = slice(1 * d_head, 2 * d_head)
    dr = (z_corr[..., cols] - z_clean[..., cols]) @ w[:, cols].T  # head 1's result change
    with torch.no_grad():
        want = layer.post_attention_layernorm(r + dr) - layer.post_attention_layernorm(r)
    u = next(i for i, s in enumerate(run.graph.senders)
             if (s.kind, s.layer, s.index) == ("head", 0, 1))
    got = run.edge_delta[:, :, u]
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    # the linearised write (the run's norm scale) is a different number: the fix bites here
    assert (run.delta[:, :, u] - want).abs().max() > 1e-3 * want.abs().max()


@pytest.mark.parametrize(("arch", "patch", "broken"), [
    ("MptForCausalLM", "alibi_qkv_fork", "never fire"),
    ("BloomForCausalLM", "bloom_block_inputs", "do not hold the residual stream"),
])
def test_per_head_inputs_work_and_the_probe_sees_them_broken_without_the_patch(
        tiny, arch, patch, broken):
    """With mechsink's patch the per-head q/k/v inputs fire, hold ``hook_resid_pre`` and an
    edit changes the logits (the probe passes and discovery is not refused); with the patch
    taken off the bridge's modules the probe finds the bridge's own fault."""
    from mechsink.model.probes import _split_problem, split_inputs_problem
    from mechsink.model.support import refusal

    model, _ = tiny(arch)
    assert split_inputs_problem(model) is None
    assert refusal(model, "discover") is None
    marker = {"alibi_qkv_fork": "_mechsink_alibi_qkv_fork",
              "bloom_block_inputs": "_mechsink_bloom_block_inputs"}[patch]
    patched = [m for m in model.modules() if getattr(m, marker, False)]
    assert patched
    try:
        for m in patched:
            del m.__dict__["forward"]  # the class's own forward again
            if hasattr(m, "_teardown_capture_hooks"):
                m._teardown_capture_hooks()  # and no input capture left from the patched runs
        problem = _split_problem(model)
    finally:
        from mechsink.model.patches.alibi_qkv_fork import install_alibi_qkv_fork
        from mechsink.model.patches.bloom_block_inputs import install_bloom_block_inputs

        for m in patched:
            object.__delattr__(m, marker)
        install_alibi_qkv_fork(model)
        install_bloom_block_inputs(model)
    assert problem is not None and broken in problem
    assert _split_problem(model) is None  # re-installed


def test_a_post_ln_residual_is_refused_by_discovery_only(tiny):
    """OpenAI GPT normalises the residual itself (post-LN): discovery's split of the residual
    into writes would be wrong, so it is refused in one line; path patching is not."""
    from mechsink.errors import BadInputError
    from mechsink.model import capabilities, check_supported

    model, _ = tiny("OpenAIGPTLMHeadModel")
    assert capabilities(model).residual_diff > 0.1
    with pytest.raises(BadInputError) as err:
        check_supported(model, "discover")
    line = str(err.value)
    assert "\n" not in line and line.startswith("OpenAIGPTLMHeadModel is not supported by "
                                                "mechsink's discover: its residual stream")
    check_supported(model, "path")  # no error
    llama, _ = tiny("LlamaForCausalLM")
    assert capabilities(llama).residual_diff <= 1e-6


def test_neuron_senders_are_refused_where_the_mlp_output_is_normalised(tiny):
    """OLMo 2 normalises the MLP's output (ln2_post): a neuron's share of the down projection
    is not its share of the write, so neuron senders are refused in one line."""
    from mechsink.discover import GraphRun
    from mechsink.errors import BadInputError

    model, _ = tiny("Olmo2ForCausalLM")
    clean, corrupted = _tokens()
    with pytest.raises(BadInputError) as err:
        GraphRun(model, clean, _metric, corrupted=corrupted, neurons={0: [1, 2]})
    line = str(err.value)
    assert "\n" not in line and line.startswith("Olmo2ForCausalLM normalises each MLP's output")


@pytest.mark.parametrize(("ablation", "positions"), [("zero", None), ("batch_mean", None),
                                                     ("position_mean", [0])])
def test_an_exact_edge_under_an_ablation_equals_path_patching_through_a_post_norm(
        tiny, ablation, positions):
    """Ablated senders on OLMo 2 (the post-attention norm recomputed from the ablated head's
    result): the exact edge equals path patching's (itself checked against the hand
    reference by the architecture suite) into the metric and into a value input."""
    from mechsink.discover import GraphRun, exact_scores
    from mechsink.patching import path_patch

    model, _ = tiny("Olmo2ForCausalLM")
    clean = torch.tensor(builder.PROBE)
    run = GraphRun(model, clean, _metric, ablation=ablation, positions=positions)
    g = run.graph
    for kind, receiver in (("metric", "metric"), ("v", "L1KV0.v")):
        e = next(e for e in range(g.n_edges)
                 if (g.senders[int(g.src[e])].kind, g.senders[int(g.src[e])].layer,
                     g.senders[int(g.src[e])].index) == ("head", 0, 1)
                 and g.receivers[int(g.dst[e])].kind == kind
                 and (kind == "metric" or (g.receivers[int(g.dst[e])].layer,
                                           g.receivers[int(g.dst[e])].index) == (1, 0)))
        got = float(exact_scores(run, edges=[e]).values[e]) + run.clean_value
        sender = "L0H1" if positions is None else "L0H1@0"
        want = float(path_patch(model, clean, None, [sender], [receiver], _metric,
                                ablation=ablation).values[0])
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), (kind, got, want)
        # a head at position 0 reaches the last position's logits only through later reads
        if kind == "v" or positions is None:
            assert abs(want - run.clean_value) > 1e-3, (kind, "the edge does nothing")
