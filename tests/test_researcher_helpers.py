"""The helpers from TransformerLens / auto-circuit habits (#30 item 9): block_every (against
TransformerLens's definition, by hand with hooks) and path vs direct effects side by side."""

from __future__ import annotations

import pytest
import scipy.stats
import torch

from mechsink.errors import BadInputError
from mechsink.model import to_tokens
from mechsink.patching import LogitDiff, block_every, path_vs_direct

CLEAN = "When Mary and John went"
CORRUPTED = "When Tom and John went"


def _pair(model):
    return (to_tokens(model, CLEAN, prepend_bos=True),
            to_tokens(model, CORRUPTED, prepend_bos=True))


def logit_metric(logits):
    return logits[0, -1, 100] - logits[0, -1, 200]


@pytest.mark.parametrize("family", ["gpt2_tiny", "llama_tiny"])
def test_block_every_equals_transformer_lens_definition(request, family):
    """get_act_patch_block_every: [3, layer, pos], resid_pre / attn_out / mlp_out, each the
    metric of the corrupted run with the clean activation written at one (layer, pos)."""
    model = request.getfixturevalue(family)
    clean, corrupted = _pair(model)
    got = block_every(model, clean, corrupted, logit_metric)
    n_layers, n_pos = int(model.cfg.n_layers), clean.shape[1]
    with torch.no_grad():
        _, cache = model.run_with_cache(clean)
        ref = torch.zeros(3, n_layers, n_pos, dtype=torch.float64)
        for c, hook in enumerate(("hook_resid_pre", "hook_attn_out", "hook_mlp_out")):
            for layer in range(n_layers):
                name = f"blocks.{layer}.{hook}"
                for pos in range(n_pos):
                    def patch(act, hook, name=name, pos=pos):
                        act[:, pos] = cache[name][:, pos]
                        return act

                    with model.hooks(fwd_hooks=[(name, patch)]):
                        ref[c, layer, pos] = logit_metric(model(corrupted)).double()
    assert got.values.shape == (3, n_layers, n_pos)
    assert got.axes == ("component", "layer", "pos")
    assert got.labels["component"] == ["resid_pre", "attn_out", "mlp_out"]
    assert (got.values - ref).abs().max() <= 1e-4
    assert ref.std() > 1e-3
    assert len(got.to_frame()) == 3 * n_layers * n_pos


def test_path_vs_direct_direct_effect_by_hand(llama_tiny):
    """The direct effect (noise): run clean with the sender's corrupted output, every other head
    and MLP frozen at its clean value; the path effect is path_patch's through the receivers.
    (llama_tiny: path_patch on GPT-2 with two senders of one layer in a batch is #29 item 7.)"""
    model = llama_tiny
    clean, corrupted = _pair(model)
    metric = LogitDiff(100, 200)
    senders = ["L0H0", "L0H1", "L0H2", "L0H3", "MLP0"]
    cmp = path_vs_direct(model, clean, corrupted, senders, ["L1H0.q", "L1H1.k"], metric)
    with torch.no_grad():
        _, c_cache = model.run_with_cache(clean)
        _, x_cache = model.run_with_cache(corrupted)

    def frozen_run(sender):
        hooks = []
        for layer in range(int(model.cfg.n_layers)):
            z, mlp = f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.hook_mlp_out"

            def set_z(act, hook, z=z, layer=layer):
                act[:] = c_cache[z]
                if sender.startswith(f"L{layer}H"):
                    h = int(sender.split("H")[1])
                    act[:, :, h] = x_cache[z][:, :, h]
                return act

            def set_mlp(act, hook, mlp=mlp, layer=layer):
                act[:] = (x_cache if sender == f"MLP{layer}" else c_cache)[mlp]
                return act

            hooks += [(z, set_z), (mlp, set_mlp)]
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            lg = model(clean)[0, -1].double()
        return float(lg[100] - lg[200])

    by_hand = torch.tensor([frozen_run(s) for s in senders], dtype=torch.float64)
    assert (cmp.direct.values - by_hand).abs().max() <= 1e-4
    frame = cmp.to_frame()
    assert list(frame["sender"]) == senders
    base = cmp.path.clean_value
    assert frame["direct"].tolist() == pytest.approx((by_hand - base).tolist(), abs=1e-4)
    rho = scipy.stats.spearmanr(frame["path"], frame["direct"])[0]
    assert cmp.spearman == pytest.approx(rho) and frame.attrs["spearman"] == cmp.spearman
    assert frame["direct_rank"].min() == 1 and "spearman=" in repr(cmp)
    with pytest.raises(BadInputError, match="not 'metric'"):
        path_vs_direct(model, clean, corrupted, senders, ["metric"], metric)
