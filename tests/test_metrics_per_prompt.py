"""Per-prompt answers and padded batches (#30 item 1) and the one metric-string parser (#30
item 2, #29 item 9): each checked against a loop with one TransformerLens forward per prompt."""

from __future__ import annotations

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.patching import (
    KLToClean,
    LogitDiff,
    LogProb,
    MassiveValue,
    ResidNorm,
    activation_patch,
    as_metric,
    pad_prompts,
    parse_metric,
)

LENGTHS = (5, 8, 6)
PAD = 0


def _padded_pair():
    """Three prompts of unequal length (right-padded), corrupted at position 2 of each, with
    per-prompt answers."""
    g = torch.Generator().manual_seed(3)
    width = max(LENGTHS)
    clean = torch.full((len(LENGTHS), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(clean)
    for i, n in enumerate(LENGTHS):
        clean[i, :n] = torch.randint(1, 50000, (n,), generator=g)
        mask[i, :n] = 1
    corrupted = clean.clone()
    corrupted[:, 2] = torch.randint(1, 50000, (len(LENGTHS),), generator=g)
    corrupted[mask == 0] = PAD
    correct = torch.tensor([11, 22, 33])
    wrong = torch.tensor([44, 55, 66])
    return clean, corrupted, mask, correct, wrong


def _last_logits(model, tokens, hooks=()):
    with torch.no_grad(), model.hooks(fwd_hooks=list(hooks)):
        return model(tokens)[0, -1].double()


def test_per_prompt_logit_diff_on_a_padded_batch_equals_a_loop(gpt2_tiny):
    model = gpt2_tiny
    clean, corrupted, mask, correct, wrong = _padded_pair()
    metric = LogitDiff(correct, wrong, attention_mask=mask)
    res = activation_patch(model, clean, corrupted, "resid_pre", metric)
    n_layers, width = int(model.cfg.n_layers), clean.shape[1]
    ref = torch.zeros(n_layers, width, dtype=torch.float64)
    clean_ref = 0.0
    for i, n in enumerate(LENGTHS):
        c, x = clean[i:i + 1, :n], corrupted[i:i + 1, :n]
        with torch.no_grad():
            _, cache = model.run_with_cache(c)
        lg = _last_logits(model, c)
        clean_ref += float(lg[correct[i]] - lg[wrong[i]]) / len(LENGTHS)
        base = _last_logits(model, x)
        for layer in range(n_layers):
            for pos in range(width):
                if pos >= n:  # a pad after the prompt: its last token cannot see it
                    lg = base
                else:
                    name = f"blocks.{layer}.hook_resid_pre"

                    def hook(act, hook, pos=pos, name=name, cache=cache):
                        act[:, pos] = cache[name][:, pos]
                        return act

                    lg = _last_logits(model, x, [(name, hook)])
                ref[layer, pos] += (lg[correct[i]] - lg[wrong[i]]) / len(LENGTHS)
    assert res.values.shape == ref.shape
    assert (res.values - ref).abs().max() <= 1e-4
    assert abs(res.clean_value - clean_ref) <= 1e-4
    assert ref.std() > 1e-3  # not trivially flat


def test_per_prompt_log_prob_and_kl_equal_a_loop(llama_tiny):
    model = llama_tiny
    clean, corrupted, mask, correct, _ = _padded_pair()
    clean, corrupted = clean % int(model.cfg.d_vocab), corrupted % int(model.cfg.d_vocab)
    lp_ref, kl_ref = [], []
    for i, n in enumerate(LENGTHS):
        c = _last_logits(model, clean[i:i + 1, :n]).log_softmax(-1)
        x = _last_logits(model, corrupted[i:i + 1, :n]).log_softmax(-1)
        lp_ref.append(float(x[correct[i]]))
        kl_ref.append(float((c.exp() * (c - x)).sum()))
    positions = mask.sum(-1) - 1
    for metric in (LogProb(correct, attention_mask=mask), LogProb(correct, position=positions)):
        res = activation_patch(model, clean, corrupted, "attn_out", metric)
        assert abs(res.corrupted_value - sum(lp_ref) / len(lp_ref)) <= 1e-5
    kl = activation_patch(model, clean, corrupted, "attn_out", KLToClean(attention_mask=mask))
    assert abs(kl.corrupted_value - sum(kl_ref) / len(kl_ref)) <= 1e-5
    assert kl.corrupted_value > 1e-4


def test_one_answer_for_the_batch_still_works(gpt2_tiny):
    clean, corrupted, *_ = _padded_pair()
    a = activation_patch(gpt2_tiny, clean, corrupted, "attn_out", LogitDiff(11, 44))
    b = activation_patch(gpt2_tiny, clean, corrupted, "attn_out",
                         LogitDiff(torch.tensor([11, 11, 11]), torch.tensor([44, 44, 44]),
                                   position=torch.tensor([-1, -1, -1])))
    assert (a.values - b.values).abs().max() <= 1e-6


def test_old_pos_keyword_names_the_new_one():
    for make in (lambda: LogitDiff(1, 2, pos=-1), lambda: LogProb(1, pos=-1),
                 lambda: KLToClean(pos=-1), lambda: ResidNorm(0, pos=1),
                 lambda: MassiveValue(0, 1, 2, pos=3)):
        with pytest.raises(BadInputError, match="position="):
            make()
    assert LogitDiff(1, 2, position=3).position == 3


def test_bad_per_prompt_inputs_are_one_line_errors(gpt2_tiny):
    clean, corrupted, mask, correct, wrong = _padded_pair()
    with pytest.raises(BadInputError, match="2 token ids .* batch of 3"):
        activation_patch(gpt2_tiny, clean, corrupted, "attn_out",
                         LogitDiff(correct[:2], wrong[:2], attention_mask=mask))
    left = mask.flip(-1)
    with pytest.raises(BadInputError, match="pad on the right"):
        LogitDiff(correct, wrong, attention_mask=left)
    with pytest.raises(BadInputError, match="not both"):
        LogitDiff(correct, wrong, position=-1, attention_mask=mask)
    with pytest.raises(BadInputError, match="integer token ids"):
        LogitDiff(torch.tensor([1.5, 2.0]), 3)
    with pytest.raises(BadInputError, match="outside the vocabulary"):
        activation_patch(gpt2_tiny, clean, corrupted, "attn_out",
                         LogitDiff(torch.tensor([1, 2, 10**6]), 3))


def test_pad_prompts_right_pads_and_masks(gpt2_tiny):
    tokens, mask = pad_prompts(gpt2_tiny, ["a b", "a b c d e"], prepend_bos=True)
    assert tokens.shape == mask.shape and mask.sum(-1).tolist() == [3, 6]
    assert mask[0].tolist() == [1, 1, 1, 0, 0, 0]
    with pytest.raises(BadInputError, match="list of prompts"):
        pad_prompts(gpt2_tiny, "a b", prepend_bos=True)


def test_activation_metric_positions_are_checked(gpt2_tiny):
    """#29 item 9: positions outside the prompt were an IndexError."""
    clean, corrupted, *_ = _padded_pair()
    for metric in (ResidNorm(1, 40), MassiveValue(1, -40, 3)):
        with pytest.raises(BadInputError, match="position -?40 is outside the 8 tokens"):
            activation_patch(gpt2_tiny, clean, corrupted, "attn_out", metric)
    for spec in ("resid_norm:1:40", "massive_value:1:40:3"):
        with pytest.raises(BadInputError, match="outside the 8 tokens"):
            parse_metric(spec, gpt2_tiny, clean, corrupted)


def test_metric_strings_one_parser(gpt2_tiny):
    """The CLI's strings give the same metric objects to the API (#30 item 2)."""
    clean, corrupted, *_ = _padded_pair()
    m = as_metric("massive_value:1:0:5", gpt2_tiny)
    a = activation_patch(gpt2_tiny, clean, corrupted, "attn_out", m)
    b = activation_patch(gpt2_tiny, clean, corrupted, "attn_out", MassiveValue(1, 0, 5))
    assert torch.equal(a.values, b.values)
    with pytest.raises(BadInputError, match=r"expected massive_value:LAYER:POS:CH \(2 arguments"):
        parse_metric("massive_value:1:0", None)
    with pytest.raises(BadInputError, match=r"sink_score:LAYER:\[HEAD\]"):
        parse_metric("sink_score:1:2:3", None)
    with pytest.raises(BadInputError, match="channel 999 is outside"):
        parse_metric("massive_value:1:0:999", gpt2_tiny)
    with pytest.raises(BadInputError, match="layer 7 is out of range"):
        parse_metric("resid_norm:7:0", gpt2_tiny)
    with pytest.raises(BadInputError, match="must be integers"):
        parse_metric("log_prob:x", None)
