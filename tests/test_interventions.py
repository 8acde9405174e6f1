"""Each intervention does exactly what it says, on the activation it names, and leaves no hook."""

from __future__ import annotations

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.interventions.edits import (
    Intervention,
    ablate,
    applied,
    attend_only_to_self,
    remove_query_bias,
    rotate_keys,
    scale_tokens,
)
from mechsink.model import to_tokens

TEXT = "Interventions move the sink: mask edits, norm scaling, ablations of heads."


@pytest.fixture(params=["gpt2_tiny", "llama_tiny"])
def model(request):
    return request.getfixturevalue(request.param)


def _run(model, interventions, tokens):
    with applied(model, interventions):
        return model.run_with_cache(tokens)


def test_self_only_mask_makes_row_k_one_hot(model):
    tokens = to_tokens(model, TEXT, prepend_bos=True)
    _, clean = model.run_with_cache(tokens)
    _, cache = _run(model, attend_only_to_self(model, [1], position=5, units=[0, 2]), tokens)
    pattern = cache["blocks.1.attn.hook_pattern"]
    one_hot = torch.zeros(pattern.shape[-1])
    one_hot[5] = 1.0
    for head in (0, 2):
        assert torch.equal(pattern[0, head, 5], one_hot)
    torch.testing.assert_close(pattern[0, 1], clean["blocks.1.attn.hook_pattern"][0, 1])
    torch.testing.assert_close(cache["blocks.0.attn.hook_pattern"],
                               clean["blocks.0.attn.hook_pattern"])


@pytest.mark.parametrize("mode", ["zero", "scale", "position_mean", "set", "batch_mean"])
def test_head_ablation_sets_the_chosen_entries(model, mode):
    tokens = to_tokens(model, TEXT, prepend_bos=True)
    _, clean = model.run_with_cache(tokens)
    edit = ablate(model, "attn.hook_z", 1, mode=mode, scale=0.5, value=7.0, units=[1],
                  positions=[0, 3])
    _, cache = _run(model, [edit], tokens)
    z, z_clean = cache["blocks.1.attn.hook_z"], clean["blocks.1.attn.hook_z"]
    others = [p for p in range(tokens.shape[1]) if p not in (0, 3)]
    expected = {"zero": torch.zeros_like(z_clean[:, [0, 3], 1]),
                "set": torch.full_like(z_clean[:, [0, 3], 1], 7.0),
                "scale": 0.5 * z_clean[:, [0, 3], 1],
                "position_mean": z_clean[:, others, 1].mean(1, keepdim=True).expand(-1, 2, -1),
                "batch_mean": z_clean[:, [0, 3], 1].mean(0, keepdim=True)}[mode]
    torch.testing.assert_close(z[:, [0, 3], 1], expected)
    torch.testing.assert_close(z[:, :, [0, 2, 3]], z_clean[:, :, [0, 2, 3]])  # other heads
    torch.testing.assert_close(z[:, others], z_clean[:, others])  # other positions


def test_scale_tokens_sets_the_norm_ratio(model):
    tokens = to_tokens(model, TEXT, prepend_bos=True)
    _, clean = model.run_with_cache(tokens)
    _, cache = _run(model, [scale_tokens(model, 1, positions=[4], factor=3.0)], tokens)
    ratio = (cache["blocks.1.hook_resid_pre"][0, 4].norm()
             / clean["blocks.1.hook_resid_pre"][0, 4].norm())
    assert ratio.item() == pytest.approx(3.0, rel=1e-5)


def test_query_bias_removal_and_key_rotation(gpt2_tiny):
    model = gpt2_tiny
    tokens = to_tokens(model, TEXT, prepend_bos=True)
    _, clean = model.run_with_cache(tokens)
    _, cache = _run(model, [remove_query_bias(model, 1)], tokens)
    torch.testing.assert_close(cache["blocks.1.attn.hook_q"],
                               clean["blocks.1.attn.hook_q"] - model.b_Q[1])
    _, cache = _run(model, [rotate_keys(model, 1, seed=3)], tokens)
    k, k_clean, b_k = cache["blocks.1.attn.hook_k"], clean["blocks.1.attn.hook_k"], model.b_K[1]
    torch.testing.assert_close((k - b_k).norm(dim=-1), (k_clean - b_k).norm(dim=-1))
    assert not torch.allclose(k, k_clean)


def test_hooks_are_removed_even_when_the_block_raises(model):
    tokens = to_tokens(model, TEXT, prepend_bos=True)
    before = model(tokens)
    with pytest.raises(RuntimeError, match="boom"):
        with applied(model, [ablate(model, "hook_mlp_out", 0, mode="zero")]):
            assert not torch.equal(model(tokens), before)
            raise RuntimeError("boom")
    assert torch.equal(model(tokens), before)


def test_bad_arguments_are_clear_errors(model):
    with pytest.raises(BadInputError, match="layer 7 is out of range"):
        ablate(model, "attn.hook_z", 7)
    with pytest.raises(BadInputError, match="unknown site"):
        ablate(model, "attn.hook_zz", 0)
    with pytest.raises(BadInputError, match="out of range"):
        ablate(model, "attn.hook_z", 0, units=[9])
    with pytest.raises(BadInputError, match="positions"):
        ablate(model, "hook_resid_pre", 0, mode="position_mean")


def test_the_old_mean_spelling_is_refused_and_says_which_mean(model):
    """``mode="mean"`` meant position_mean in ablate and batch_mean in patching: it is gone, and
    the error names both kinds."""
    with pytest.raises(BadInputError, match="position_mean.*batch_mean"):
        ablate(model, "hook_mlp_out", 0, mode="mean", positions=[0])


def test_first_token_manipulations():
    from mechsink.interventions.edits import remove_bos, replace_first, shift_to_first

    tokens = torch.tensor([[9, 1, 2, 3], [9, 4, 5, 6]])
    assert remove_bos(tokens, 9).tolist() == [[1, 2, 3], [4, 5, 6]]
    assert replace_first(tokens, torch.tensor([7, 8])).tolist() == [[7, 1, 2, 3], [8, 4, 5, 6]]
    assert shift_to_first(tokens, 2).tolist() == [[2, 3], [5, 6]]
    assert tokens[0, 0] == 9  # inputs are not modified
    with pytest.raises(BadInputError, match="BOS"):
        remove_bos(tokens, 1)
    with pytest.raises(BadInputError, match="two tokens"):
        shift_to_first(tokens, 3)


def test_batch_mean_and_resample_over_a_batch(model):
    tokens = to_tokens(model, ["Interventions move the sink", "Heads pour attention on"],
                       prepend_bos=True, seq_len=5)
    _, clean = model.run_with_cache(tokens)
    mlp = clean["blocks.0.hook_mlp_out"]
    _, cache = _run(model, [ablate(model, "hook_mlp_out", 0, mode="batch_mean",
                                   positions=[2])], tokens)
    torch.testing.assert_close(cache["blocks.0.hook_mlp_out"][:, 2],
                               ((mlp[0, 2] + mlp[1, 2]) / 2).expand(2, -1))
    _, cache = _run(model, [ablate(model, "hook_mlp_out", 0, mode="resample", seed=1,
                                   positions=[1])], tokens)
    rows = torch.randint(2, (2,), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(cache["blocks.0.hook_mlp_out"][:, 1], mlp[rows, 1])
    torch.testing.assert_close(cache["blocks.0.hook_mlp_out"][:, 0], mlp[:, 0])


def test_positions_beyond_the_sequence_fail_before_any_block(model):
    tokens = to_tokens(model, "a short one", prepend_bos=True)
    ran = {"blocks": 0}

    def count(act, hook):
        ran["blocks"] += 1

    edits = [ablate(model, "attn.hook_z", 1, positions=[99]),
             Intervention("blocks.0.hook_resid_pre", count, "count block 0")]
    with pytest.raises(BadInputError, match="position 99 is beyond the sequence"):
        with applied(model, edits):
            model(tokens)
    assert ran["blocks"] == 0
    assert all(not hp.fwd_hooks for hp in model.hook_dict.values())


def test_remove_query_bias_needs_a_query_bias(llama_tiny):
    with pytest.raises(BadInputError, match="no query bias"):
        remove_query_bias(llama_tiny, 0)


def test_the_readout_removes_its_edits_even_when_a_measurement_raises(model):
    from mechsink.interventions.readout import read_with_edits
    from mechsink.measure.forward import Measurement

    tokens = to_tokens(model, TEXT, prepend_bos=True)
    before = model(tokens)

    def boom(forward):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        read_with_edits(model, tokens, {"x": Measurement(("hook_mlp_out",), boom)},
                        [ablate(model, "hook_mlp_out", 0, mode="zero")])
    assert torch.equal(model(tokens), before)
