"""Every decoder-only architecture TransformerLens's bridge registers, as a tiny random-init
model, against transformers' own outputs and TransformerLens's own patching functions.

Known failures are strict xfails listed in :mod:`tests.architectures.expected`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.architectures import builder, expected

pytestmark = pytest.mark.slow  # ~85 tiny models, 840 checks: about 4 minutes on 2 loaded cores

ARCHS = builder.registered()
TOL = 1e-4


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max abs difference relative to the reference's largest magnitude (at least 1): logits
    of tens agree to float32 rounding, ~1e-6 of their size."""
    return ((a.double() - b.double()).abs().max() / b.abs().max().clamp_min(1.0)).item()


@pytest.mark.parametrize("arch", expected.cases("logits", ARCHS))
def test_logits_hf_folder(suite, arch, record_property):
    m = suite.get(arch)
    with torch.no_grad():
        got = m.bridge(m.tokens)
    record_property("diff", rel(got, m.logits))
    assert rel(got, m.logits) <= TOL


@pytest.mark.parametrize("arch", expected.cases("wrap", ARCHS))
def test_logits_wrap(suite, arch, record_property):
    import transformers

    import mechsink

    m = suite.get(arch)
    plain = transformers.AutoModelForCausalLM.from_pretrained(
        str(m.folder), attn_implementation="eager")
    wrapped = mechsink.wrap(plain)
    with torch.no_grad():
        got = wrapped(m.tokens)
    record_property("diff", rel(got, m.logits))
    assert rel(got, m.logits) <= TOL


@pytest.mark.parametrize("arch", expected.cases("unembed", ARCHS))
def test_engine_unembed_equals_logits(suite, arch, record_property):
    """mechsink.model.unembed of the last block's output is the model's own logits (final
    soft-cap and logit scale included)."""
    from mechsink.model import act_name, unembed

    m = suite.get(arch)
    last = act_name("resid_post", int(m.bridge.cfg.n_layers) - 1)
    with torch.no_grad():
        _, cache = m.bridge.run_with_cache(m.tokens, names_filter=[last])
        got = unembed(m.bridge, cache[last])
    record_property("diff", rel(got, m.logits))
    assert rel(got, m.logits) <= TOL


@pytest.mark.parametrize("arch", expected.cases("start_at_layer", ARCHS))
def test_run_from_layer_uses_the_residual(suite, arch, record_property):
    """run_from_layer(resid_pre[1], 1) gives the logits, and a changed residual changes them."""
    from mechsink.model import act_name, run_from_layer

    m = suite.get(arch)
    name = act_name("resid_pre", 1)
    with torch.no_grad():  # mechsink first: a model it refuses is refused here, in one line
        run_from_layer(m.bridge, torch.zeros(1, 3, int(m.bridge.cfg.d_model)), 1)
        _, cache = m.bridge.run_with_cache(m.tokens, names_filter=[name])
        resid = cache[name]
        got = run_from_layer(m.bridge, resid.clone(), 1)
        other = run_from_layer(m.bridge, resid.flip(0).clone(), 1)
    record_property("diff", max(rel(got, m.logits), rel(other, m.logits.flip(0))))
    assert rel(got, m.logits) <= TOL
    assert rel(other, m.logits.flip(0)) <= TOL


@pytest.mark.parametrize("arch", expected.cases("census", ARCHS))
def test_census_equals_hand_computation(suite, arch, record_property):
    """Sink scores from transformers' eager attentions; first-token norm ratios and the largest
    residual magnitudes from its hidden states (blocks before the last: transformers' last
    hidden state is after the final norm)."""
    from mechsink.inputs.prompts import PromptSet
    from mechsink.measure.census import census

    m = suite.get(arch)
    got = census(m.bridge, prompts=[PromptSet("custom", "given", m.tokens)], batch_size=2,
                 progress=lambda *a: None)
    run = got.runs[0]
    want = torch.stack([a[:, :, :, 0].mean(-1) for a in m.attentions], 1)  # [b, layer, head]
    hidden = torch.stack(m.hidden[1:-1], 1)  # [b, layer < L-1, pos, d]
    norms = hidden.norm(dim=-1)
    ratio = norms[..., 0] / norms[..., 1:].mean(-1)
    top1 = hidden.abs().flatten(2).max(-1).values
    diffs = [(run.sinks.gu - want).abs().max().item(),
             rel(run.norm_ratio.values[:, :-1], ratio), rel(run.massive.top3[:, :-1, 0], top1)]
    record_property("diff", max(diffs))
    assert max(diffs) <= TOL
    assert got.to_dict()["runs"][0]["sink_rate"] is not None


def _logit_metric(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, 5] - logits[:, -1, 7]).mean()


SITES = {"resid_pre": "get_act_patch_resid_pre", "attn_out": "get_act_patch_attn_out",
         "mlp_out": "get_act_patch_mlp_out", "z_all_pos": "get_act_patch_attn_head_out_all_pos"}


def _corrupted(tokens: torch.Tensor) -> torch.Tensor:
    c = tokens.clone()
    c[:, 1:3] = (c[:, 1:3] + 13) % 60
    return c


@pytest.mark.parametrize(("arch", "site"), expected.cases("activation", ARCHS, SITES))
def test_activation_patching_equals_transformer_lens(suite, arch, site, record_property):
    """mechsink's batched engine against transformer_lens.patching (one forward per patch)."""
    import transformer_lens.patching as tlp

    from mechsink.patching import activation_patch

    m = suite.get(arch)
    clean, corrupted = m.tokens[:1], _corrupted(m.tokens[:1])
    got = activation_patch(m.bridge, clean, corrupted, site, _logit_metric)  # refusals first
    with torch.no_grad():
        _, cache = m.bridge.run_with_cache(clean)
        ref = getattr(tlp, SITES[site])(m.bridge, corrupted, cache, _logit_metric)
    assert got.values.shape == ref.shape
    record_property("diff", rel(got.values, ref))
    assert rel(got.values, ref) <= TOL


@pytest.mark.parametrize("arch", expected.cases("logit_metric", ARCHS))
def test_builtin_logit_metric_equals_plain_callable(suite, arch, record_property):
    """LogitDiff (the engine unembeds the read positions itself) equals the same difference of
    the model's own logits, per patch."""
    from mechsink.patching import LogitDiff, activation_patch

    m = suite.get(arch)
    clean, corrupted = m.tokens[:1], _corrupted(m.tokens[:1])
    plain = activation_patch(m.bridge, clean, corrupted, "resid_pre", _logit_metric)
    built = activation_patch(m.bridge, clean, corrupted, "resid_pre", LogitDiff(5, 7))
    record_property("diff", rel(built.values, plain.values))
    assert rel(built.values, plain.values) <= TOL


ROT_Q0 = "blocks.0.attn.hook_rot_q"


def _rot_q_norm_metric() -> Any:
    """A metric reading block 0's rotated queries (``attn.hook_rot_q``): their mean norm."""
    from mechsink.patching.metrics import Metric, Needs, Outputs

    class RotQNorm(Metric):
        name = "rot_q_norm"

        def needs(self, model: Any) -> Needs:
            return Needs(hooks=frozenset({ROT_Q0}))

        def __call__(self, out: Outputs) -> torch.Tensor:
            return out.act(ROT_Q0).norm(dim=-1).mean()

    return RotQNorm()


def test_a_metric_whose_hook_never_fires_is_refused_in_one_line(suite):
    """JetMoE's bridge declares attn.hook_rot_q but never fires it: a metric reading it is
    refused before any patched forward, in one line naming the architecture, the metric and
    the hook (it was a KeyError from deep inside the sweep)."""
    from mechsink.errors import BadInputError
    from mechsink.model import capabilities
    from mechsink.patching import activation_patch

    m = suite.get("JetMoeForCausalLM")
    capabilities(m.bridge)  # the cheap probes (cached): what the refusal is decided from
    calls: list[int] = []
    handle = m.bridge.register_forward_pre_hook(lambda *a: calls.append(1))
    try:
        with pytest.raises(BadInputError) as err:
            activation_patch(m.bridge, m.tokens[:1], _corrupted(m.tokens[:1]), "resid_pre",
                             _rot_q_norm_metric())
    finally:
        handle.remove()
    text = str(err.value)
    assert "\n" not in text and text.startswith("JetMoeForCausalLM is not supported by the "
                                                "metric 'rot_q_norm'")
    assert ROT_Q0 in text and "never fires" in text
    assert calls == [], "a forward ran before the refusal"


def test_a_metric_whose_hook_fires_runs(suite):
    """The same metric on Llama (hook_rot_q fires): its clean value is the norm read by hand."""
    from mechsink.patching import activation_patch

    m = suite.get("LlamaForCausalLM")
    clean = m.tokens[:1]
    got = activation_patch(m.bridge, clean, _corrupted(clean), "resid_pre", _rot_q_norm_metric())
    with torch.no_grad():
        _, cache = m.bridge.run_with_cache(clean, names_filter=[ROT_Q0])
    want = cache[ROT_Q0].norm(dim=-1).mean().item()
    assert abs(got.clean_value - want) <= TOL * max(1.0, abs(want))
    assert got.values.shape[0] == int(m.bridge.cfg.n_layers)


def test_the_engine_reads_the_models_own_logits_where_its_unembedding_is_inexact(
        suite, monkeypatch):
    """Without ModernBERT-decoder's prediction head mechsink's unembedding is not the model's
    (the probe sees it); LogitDiff then reads the model's own logits and stays exact."""
    import mechsink
    from mechsink.model import capabilities, shortcuts
    from mechsink.patching import LogitDiff, activation_patch

    m = suite.get("ModernBertDecoderForCausalLM")
    monkeypatch.setattr(shortcuts, "READOUT_HEADS", ())
    bridge = mechsink.load_model(f"hf:{m.folder}", device="cpu")
    caps = capabilities(bridge)
    assert not caps.unembed_exact and caps.unembed_diff > 0.1
    clean, corrupted = m.tokens[:1], _corrupted(m.tokens[:1])
    plain = activation_patch(bridge, clean, corrupted, "resid_pre", _logit_metric)
    built = activation_patch(bridge, clean, corrupted, "resid_pre", LogitDiff(5, 7))
    assert rel(built.values, plain.values) <= TOL


def test_logit_splits_refuse_a_norm_after_the_rotary_embedding(suite):
    """HunYuan normalises q and k after rotating them: both logit splits (which assume the
    rotation is the last step) refuse it in one line; on Llama they run."""
    from mechsink.errors import BadInputError
    from mechsink.measure.logit_split import bias_logit_split, key_logit_split

    m = suite.get("HunYuanDenseV1ForCausalLM")
    for split in (lambda b: key_logit_split(b, m.tokens, 1, 0, [3]),
                  lambda b: bias_logit_split(b, m.tokens, 1)):
        with pytest.raises(BadInputError, match="^HunYuanDenseV1ForCausalLM normalises its "
                                                "queries and keys after the rotary") as err:
            split(m.bridge)
        assert "\n" not in str(err.value)
    llama = suite.get("LlamaForCausalLM").bridge
    key_logit_split(llama, m.tokens, 1, 0, [3])
    bias_logit_split(llama, m.tokens, 1)


@pytest.mark.parametrize("arch", ["OPTForCausalLM", "XGLMForCausalLM"])
def test_neuron_count_is_the_transformers_mlp_width(suite, arch):
    """TransformerLens reports OPT's and XGLM's MLP width as 4 x d_model whatever their
    ``ffn_dim``: neuron sites and names (``L0N5``) count the transformers config's width, the
    size of the hooked MLP activation."""
    from mechsink.names import axis_size

    m = suite.get(arch)
    width = int(m.hf.config.ffn_dim)
    assert int(m.bridge.cfg.d_mlp) != width  # the bridge's value (the case this guards)
    assert axis_size(m.bridge, "neuron") == width
    with torch.no_grad():
        _, cache = m.bridge.run_with_cache(m.tokens, names_filter=["blocks.0.mlp.hook_post"])
    assert cache["blocks.0.mlp.hook_post"].shape[-1] == width
