"""The query-bias dose targets against hand computations from transformers' own modules."""

from __future__ import annotations

import math

import pytest
import torch

from mechsink import wrap
from mechsink.errors import BadInputError
from mechsink.interventions.bias_targets import (
    key_structure_set,
    mlp0_at_first_token,
    query_bias_key0_set,
    query_bias_set,
    rotated_query_bias,
)
from mechsink.interventions.dose import dose_response
from mechsink.interventions.edits import applied
from mechsink.model import act_name
from mechsink.model.zoo.random_init import seeded_model
from mechsink.model.zoo.tokenizer import gpt2_tokenizer


def _tiny_qwen2(seed: int = 0):
    """A 2-layer Qwen2 (rotary, grouped-query attention, q/k/v biases) with biases large
    enough to matter."""
    import transformers

    cfg = transformers.Qwen2Config(
        vocab_size=50257, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        bos_token_id=50256, eos_token_id=50256, tie_word_embeddings=False)
    hf = seeded_model(cfg, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                proj.bias.copy_(torch.randn(proj.bias.shape, generator=gen))
    return hf


@pytest.fixture(scope="module")
def qwen_pair():
    hf = _tiny_qwen2()
    return hf, wrap(hf, gpt2_tokenizer(), name="tiny-qwen2")


def _tokens(n: int = 3, t: int = 10) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    toks = torch.randint(100, 5000, (n, t), generator=gen)
    toks[:, 0] = 50256
    return toks


def _hf_scores(hf, tokens: torch.Tensor, layer: int, drop_bias: bool) -> torch.Tensor:
    """Layer ``layer``'s pre-softmax logits computed by hand from transformers' modules:
    q and k from the layer's own projections (optionally without b_Q), rotated by the model's
    own rotary embedding, scaled by its own ``scaling``."""
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    captured = {}
    attn = hf.model.layers[layer].self_attn

    def grab(mod, args, kwargs):
        captured["x"] = kwargs.get("hidden_states", args[0] if args else None)
        captured["pe"] = kwargs["position_embeddings"]

    h = attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            hf(tokens)
    finally:
        h.remove()
    x = captured["x"]
    b, t, _ = x.shape
    d = attn.head_dim
    with torch.no_grad():
        q = x @ attn.q_proj.weight.T + (0 if drop_bias else attn.q_proj.bias)
        k = attn.k_proj(x)
        q = q.view(b, t, -1, d).transpose(1, 2)
        k = k.view(b, t, -1, d).transpose(1, 2)
        cos, sin = captured["pe"]
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        return (q @ k.transpose(-1, -2)) * attn.scaling


def _model_scores(model, tokens, layer, edits):
    got = {}

    def rec(s, hook):
        got["s"] = s.detach().clone()

    with applied(model, edits):
        model.run_with_hooks(tokens, fwd_hooks=[(act_name("attn.hook_attn_scores", layer), rec)],
                             stop_at_layer=layer + 1)
    return got["s"]


def test_targeted_removal_touches_only_key0_by_exactly_bq_dot_k0(qwen_pair):
    hf, model = qwen_pair
    tokens = _tokens()
    layer = 1
    full = _hf_scores(hf, tokens, layer, drop_bias=False)
    no_bq = _hf_scores(hf, tokens, layer, drop_bias=True)
    target = query_bias_key0_set(model, [layer], seq_len=tokens.shape[1])
    edited = _model_scores(model, tokens, layer, target.edits(0.0)).double()
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    # key 0: the logit without b_Q's part; every other key: the clean logit
    assert torch.allclose(edited[..., 0], no_bq[..., 0].double(), atol=1e-4)
    assert torch.allclose(edited[..., 1:][..., causal[:, 1:]], full[..., 1:][..., causal[:, 1:]]
                          .double(), atol=1e-4)
    # a half dose removes half of the term
    half = _model_scores(model, tokens, layer, target.edits(0.5)).double()
    assert torch.allclose(half[..., 0], (full[..., 0] + no_bq[..., 0]).double() / 2, atol=1e-4)
    # the term is real here (the test would pass vacuously with b_Q . k_0 = 0)
    assert float((full[..., 0] - no_bq[..., 0]).abs().max()) > 0.1


def test_query_bias_scaling_matches_the_model_without_bias(qwen_pair):
    hf, model = qwen_pair
    tokens = _tokens()
    no_bq = _hf_scores(hf, tokens, 0, drop_bias=True)
    edited = _model_scores(model, tokens, 0, query_bias_set(model, [0]).edits(0.0)).double()
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    assert torch.allclose(edited[..., causal], no_bq[..., causal].double(), atol=1e-4)


def test_rotated_query_bias_is_the_rotary_rotation_of_b_q(qwen_pair):
    hf, model = qwen_pair
    from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

    attn = hf.model.layers[0].self_attn
    d = attn.head_dim
    rq = rotated_query_bias(model, 0, 6)
    b = attn.q_proj.bias.detach().view(1, -1, 1, d).expand(1, -1, 6, d)
    pos = torch.arange(6)[None]
    cos, sin = hf.model.rotary_emb(b, pos)
    rot, _ = apply_rotary_pos_emb(b, b, cos, sin)
    assert torch.allclose(rq, rot[0].transpose(0, 1), atol=1e-5)


def test_gpt2_targeted_term_equals_the_hand_computed_delta(gpt2_tiny):
    """Absolute positions: the removed term is b_Q . k_0 / sqrt(d_head) from the weights."""
    model = gpt2_tiny
    tokens = _tokens(2, 8)
    layer = 1
    gen = torch.Generator().manual_seed(3)
    attn = model.blocks[layer].attn
    c_attn = attn.original_component.c_attn
    old = c_attn.bias.detach().clone()
    try:
        with torch.no_grad():
            c_attn.bias.copy_(torch.randn(old.shape, generator=gen))
        clean = _model_scores(model, tokens, layer, []).double()
        edited = _model_scores(model, tokens, layer,
                               query_bias_key0_set(model, [layer], 8).edits(0.0)).double()
        _, cache = model.run_with_cache(tokens, names_filter=[act_name("attn.hook_k", layer)],
                                        stop_at_layer=layer + 1)
        k0 = cache[act_name("attn.hook_k", layer)][:, 0].double()  # [batch, head, d]
        d = int(model.cfg.d_head)
        b_q = c_attn.bias.detach()[: model.cfg.d_model].view(-1, d).double()
        term = torch.einsum("he,bhe->bh", b_q, k0) / math.sqrt(d)
        assert torch.allclose(clean[..., 0] - edited[..., 0], term[:, :, None].expand_as(
            edited[..., 0]), atol=1e-4)
        assert torch.equal(clean[..., 1:], edited[..., 1:])
    finally:
        with torch.no_grad():
            c_attn.bias.copy_(old)


def test_dose_response_with_the_targeted_target_runs_the_whole_grid(qwen_pair):
    _, model = qwen_pair
    tokens = _tokens(4, 10)
    target = query_bias_key0_set(model, [0, 1], seq_len=10)
    dr = dose_response(model, tokens, target, doses=(0.0, 0.5, 1.0), eps=0.01,
                       late_layers=(0, 1), n_boot=50)
    assert dr.doses == (0.0, 0.5, 1.0)
    assert all(r.sink_rate.low <= r.sink_rate.mean <= r.sink_rate.high for r in dr.rows)
    # the edit changes the sink: factor 0 differs from clean
    assert dr.row(0.0).late_sink_score.mean != pytest.approx(dr.row(1.0).late_sink_score.mean)


def test_targets_refuse_a_model_without_query_bias(llama_tiny):
    with pytest.raises(BadInputError, match="no query bias"):
        query_bias_set(llama_tiny, [0])
    with pytest.raises(BadInputError, match="no query bias"):
        query_bias_key0_set(llama_tiny, [0], 8)


def test_targeted_edit_refuses_a_longer_input(qwen_pair):
    _, model = qwen_pair
    target = query_bias_key0_set(model, [0], seq_len=6)
    with pytest.raises(BadInputError, match="built for 6 tokens"), applied(model,
                                                                          target.edits(0.0)):
        model(_tokens(1, 8))


def test_mlp0_and_key_structure_targets_are_identity_at_one(qwen_pair):
    _, model = qwen_pair
    tokens = _tokens(2, 8)
    clean = _model_scores(model, tokens, 1, [])
    for target in (mlp0_at_first_token(model), key_structure_set(model, [0, 1], seed=0)):
        assert torch.allclose(_model_scores(model, tokens, 1, target.edits(1.0)), clean,
                              atol=1e-5)
        assert not torch.allclose(_model_scores(model, tokens, 1, target.edits(0.0)), clean,
                                  atol=1e-3)


def test_query_bias_dose_experiment_on_the_organism(tmp_path):
    """The experiment end to end on the shipped GPT-2 organism: every part dosed, each verdict
    with its criterion, the result saved whole and re-rendered from its JSON."""
    from mechsink import load_model
    from mechsink.experiments.query_bias_dose import run
    from mechsink.experiments.result import ExperimentResult

    model = load_model("organism:bb-gpt2-tiny")
    result = run(model, model_name="organism:bb-gpt2-tiny", n=8, seq_len=16,
                 doses=(0.0, 0.5, 1.0))  # 8 prompts: the fewest whose intervals are called
    data = result.data
    assert set(data["curves"]) >= {"query bias (every query)",
                                   "b_Q . k_0 only (logits to key 0)", "W_K structure"}
    for name, v in data["verdicts"].items():
        assert v["verdict"] in {"necessary", "dispensable", "undecided"}, name
        assert "50%" in v["criterion"]
    # the targeted part removes less than the whole bias at every dose below 1 on this model
    whole = data["curves"]["query bias (every query)"]["rows"][0]["late_sink_score"]["mean"]
    only = data["curves"]["b_Q . k_0 only (logits to key 0)"]["rows"][0]["late_sink_score"]
    assert only["mean"] != pytest.approx(whole)
    result.save(tmp_path)
    again = ExperimentResult.load(tmp_path, "query_bias_dose")
    assert again.summary() == result.summary()
    assert (tmp_path / "dose_response.png").stat().st_size > 0
