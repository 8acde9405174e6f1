"""C4's interventions as dose-responses: the variance amplification against the same edit made
by hand with a plain torch hook on plain transformers, the self-only mask's strength, and the
dose-response's monotone saturation on a two-layer Llama whose weights are set by hand (every
expected number computed here: RMSNorm, rotary angle and softmax written out)."""

from __future__ import annotations

import math

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.experiments.structural_origin import (
    SATURATED_STEP,
    _move_read,
    move_the_sink,
    move_verdict,
)
from mechsink.inputs.prompts import make_prompts
from mechsink.interventions.edits import amplify_deviation, applied, attend_only_to_self
from mechsink.model import act_name, wrap_hf


def test_variance_amplification_is_the_hand_edit_on_plain_transformers(llama_tiny):
    from mechsink.model.zoo import random_hf_model

    tokens = make_prompts(llama_tiny, "random", "bos", n=6, seq_len=12, seed=2).tokens
    k, a = 5, 7.0
    plain, _ = random_hf_model("llama-tiny", seed=0)  # the same weights, no bridge, no hooks
    layer1 = plain.model.layers[1]
    seen = []
    grab = layer1.register_forward_pre_hook(
        lambda m, args, kw: seen.append((args[0] if args else kw["hidden_states"]).clone()),
        with_kwargs=True)
    try:
        with torch.no_grad():
            plain(tokens)
    finally:
        grab.remove()
    center = seen[0][:, k].double().mean(0)  # mean over sequences at k, entering block 1

    def hand(module, args, kw):
        h = (args[0] if args else kw["hidden_states"]).clone()
        h[:, k] = (center + a * (h[:, k].double() - center)).to(h.dtype)
        return ((h, *args[1:]), kw) if args else (args, {**kw, "hidden_states": h})

    edit = layer1.register_forward_pre_hook(hand, with_kwargs=True)
    try:
        with torch.no_grad():
            out = plain(tokens, output_attentions=True)
    finally:
        edit.remove()
    _, clean = llama_tiny.run_with_cache(tokens, names_filter=act_name("resid_pre", 1))
    ours_center = clean[act_name("resid_pre", 1)][:, k].double().mean(0)
    torch.testing.assert_close(ours_center, center, atol=1e-6, rtol=0)
    with applied(llama_tiny, [amplify_deviation(llama_tiny, 1, [k], a, ours_center[None])]):
        logits, cache = llama_tiny.run_with_cache(tokens)
    torch.testing.assert_close(cache[act_name("resid_pre", 1)][:, k].double(),
                               center + a * (seen[0][:, k].double() - center), atol=1e-5,
                               rtol=1e-6)
    torch.testing.assert_close(logits, out.logits, atol=1e-5, rtol=1e-5)
    # the sink score at k (queries after k, every layer and head) through C4's own readout
    attn = torch.stack(out.attentions, 1).double()  # [batch, layer, head, query, key]
    hand_score = attn[..., k + 1:, k].mean(-1).mean((1, 2))
    read = _move_read(llama_tiny, tokens, [amplify_deviation(
        llama_tiny, 1, [k], a, ours_center[None])], [0, k], channel=3, batch_size=4, eps=0.3)
    torch.testing.assert_close(read[k]["score"], hand_score, atol=1e-6, rtol=0)


def test_amplify_deviation_refuses_a_center_of_the_wrong_shape(llama_tiny):
    with pytest.raises(BadInputError, match="center must hold"):
        amplify_deviation(llama_tiny, 1, [3, 4], 2.0, torch.zeros(3, 64))


def test_the_self_only_mask_strength_mixes_the_row_toward_one_hot(llama_tiny):
    tokens = make_prompts(llama_tiny, "random", "bos", n=2, seq_len=10, seed=4).tokens
    k, s = 6, 0.4
    name = act_name("pattern", 1)
    _, clean = llama_tiny.run_with_cache(tokens, names_filter=name)
    with applied(llama_tiny, attend_only_to_self(llama_tiny, [1], k, strength=s)):
        _, edited = llama_tiny.run_with_cache(tokens, names_filter=name)
    row = clean[name][:, :, k]
    expected = (1 - s) * row
    expected[..., k] += s
    torch.testing.assert_close(edited[name][:, :, k], expected, atol=1e-6, rtol=0)
    others = [q for q in range(tokens.shape[1]) if q != k]
    torch.testing.assert_close(edited[name][:, :, others], clean[name][:, :, others])
    with pytest.raises(BadInputError, match="strength"):
        attend_only_to_self(llama_tiny, [1], k, strength=1.5)


# --- a model where the dose-response of the amplified variance is known ------------------------

D, HD, N_POS = 16, 8, 12
CONST, E = 0, 1  # every token: 1 on CONST; token 2: +1 on E, token 3: -1 on E
QA = KB = 1.0  # layer 1 head 0 reads E as its query and key, in the slowest rotary pair
THETA, EPS_NORM = 1e6, 1e-6


def _build():
    from transformers import LlamaConfig

    from mechsink.model.zoo import gpt2_tokenizer, seeded_model

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=D, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=8, vocab_size=50257,
                      max_position_embeddings=64, rope_theta=THETA, rms_norm_eps=EPS_NORM,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=1)
    hf = seeded_model(cfg, 0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.zero_()
        for name, p in hf.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.fill_(1.0)
        emb = hf.model.embed_tokens.weight
        emb[:, CONST] = 1.0
        emb[2, E], emb[3, E] = 1.0, -1.0
        attn = hf.model.layers[1].self_attn
        attn.q_proj.weight[3, E] = QA  # head 0, dim 3: the slowest rotary pair (with dim 7)
        attn.k_proj.weight[3, E] = KB
        # other tokens carry content the last block's values move (what mechsink's probe of
        # pattern edits looks for); the prompts here use tokens 2 and 3 only, read before it
        for t in range(4, 50257):
            emb[t, 4 + t % 8] = 1.0
        attn.v_proj.weight[:8, 4:12] = torch.eye(8)
        attn.o_proj.weight[4:12, :8] = torch.eye(8)
        hf.lm_head.weight.normal_(generator=torch.Generator().manual_seed(1))
    return wrap_hf(hf, gpt2_tokenizer(), name="variance-llama")


def _hand_sink(key: int, k: int, a: float) -> float:
    """The C4 readout at ``key`` (queries after it, mean over the 2 x 2 heads) with the
    deviation of x_k from its mean over sequences (0 on E, the sequences split evenly) times
    ``a``: the key (and query) of k is KB a / rms(1, a), every other KB / rms(1, 1); three
    heads are uniform."""
    def rms(e: float) -> float:
        return math.sqrt((1.0 + e * e) / D + EPS_NORM)

    omega = THETA ** (-(2 * 3) / HD)
    head = []
    for i in range(key + 1, N_POS):
        q = QA * (a if i == k else 1.0) / rms(a if i == k else 1.0)  # query k is edited too
        z = [q * (KB * (a if j == k else 1.0) / rms(a if j == k else 1.0))
             * math.cos((i - j) * omega) / math.sqrt(HD) for j in range(i + 1)]
        top = max(z)
        w = [math.exp(v - top) for v in z]
        head.append(w[key] / sum(w))
    uniform = sum(1.0 / (i + 1) for i in range(key + 1, N_POS)) / (N_POS - key - 1)
    return (3 * uniform + sum(head) / len(head)) / 4


def test_the_amplified_variance_dose_response_rises_monotonically_to_saturation():
    model = _build()
    tokens = torch.tensor([[2] * N_POS, [3] * N_POS] * 4)  # 8 prompts: verdicts are called
    k, factors = 4, (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
    rows, curves = move_the_sink(model, tokens, {"channel": E, "layer": 0}, [k],
                                 mask_strengths=(1.0,), amplify_factors=factors,
                                 plant_factors=(1.0,), batch_size=3)
    var = [r for r in rows if r["intervention"] == "variance amplified"]
    got = [r["sink_at_k_after"] for r in var]
    want = [_hand_sink(k, k, a) for a in factors]
    assert got == pytest.approx(want, abs=1e-5)
    assert var[0]["sink_at_k_after"] == pytest.approx(var[0]["sink_at_k_before"], abs=1e-6)
    assert all(b > a for a, b in zip(got, got[1:], strict=False))  # monotone
    assert want[-1] - want[-2] < 0.01 * (want[-1] - want[0])  # saturated by hand
    curve = next(c for c in curves if c["intervention"] == "variance amplified")
    assert curve["sink_at_k"] == pytest.approx(want, abs=1e-5)
    assert curve["saturated"] and abs(curve["last_step"]["mean"]) < SATURATED_STEP
    # the norm alone does nothing here: RMSNorm removes a scale, the variance is what moves k
    norm = [r["sink_at_k_after"] for r in rows if r["intervention"] == "norm amplified"]
    assert norm == pytest.approx([want[0]] * len(factors), abs=1e-5)
    # every row carries its intervals with n, and the verdict reads the paired ones: both
    # groups of prompts give the same figures here, so the intervals have zero width
    iv = var[-1]["intervals"]
    assert iv["sink_at_k_after"]["n"] == 8 and iv["rise_at_k"]["low"] > 0
    zero_before, zero_after = _hand_sink(0, k, 1.0), _hand_sink(0, k, factors[-1])
    assert var[-1]["sink_at_0_after"] == pytest.approx(zero_after, abs=1e-5)
    moved = want[-1] > 0.5 * zero_before and want[-1] > zero_after
    assert var[-1]["moved"] == moved and var[-1]["rose"] == (
        want[-1] >= max(0.1, 2 * want[0]))
    moved_at = [w > 0.5 * zero_before and w > _hand_sink(0, k, a)
                for w, a in zip(want, factors, strict=True)]
    rose_at = [w >= max(0.1, 2 * want[0]) and w > want[0] + 1e-9 for w in want]
    assert [r["moved"] for r in var] == moved_at and [r["rose"] for r in var] == rose_at
    expected = "supported" if any(moved_at) else "partial" if any(rose_at) else "not supported"
    assert move_verdict(var, curves)["verdict"] == expected
