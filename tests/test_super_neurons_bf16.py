"""The super-neuron measurements on a bfloat16 model read the blocks' own down projections and
convert only the entries they use: no float32 copy of every layer (7.5 GB on an 8B model, one
kept per census run before), with the numbers a float32 stacked copy gives."""

from __future__ import annotations

import pytest
import torch

import mechsink
from mechsink.measure import layer_stack
from mechsink.measure.layer_stack import LayerStack, down_projection_layers
from mechsink.measure.super_neurons import SET_HOOKS, mlp_spikes, super_neuron_sets
from mechsink.model import act_name


@pytest.fixture(scope="module")
def bf16_model():
    return mechsink.load_model("random:llama-tiny", device="cpu", dtype="bfloat16")


def test_spikes_and_sets_copy_no_layer_and_match_the_float32_stack(bf16_model, monkeypatch):
    model = bf16_model
    n_layers = int(model.cfg.n_layers)
    tokens = torch.randint(0, 50257, (2, 12), generator=torch.Generator().manual_seed(0))
    names = {act_name(h.split(".")[-1] if h.startswith("hook_") else h, layer)
             for layer in range(n_layers) for h in SET_HOOKS}
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    # the independent reference: every block's W_out stacked by hand, in float32
    full = torch.stack([b.mlp.W_out.detach() for b in model.blocks]).float()
    lazy = down_projection_layers(model)
    assert isinstance(lazy, LayerStack) and lazy.dtype == torch.bfloat16

    copies: list[str] = []
    real_each, real_mat = LayerStack._each, LayerStack.materialize

    def each(self, fn):
        out = real_each(self, fn)
        ptrs = [t.untyped_storage().data_ptr() for t in self._layers]
        if [t.untyped_storage().data_ptr() for t in out._layers] != ptrs:  # not a view
            copies.append("per-layer conversion")
        return out

    def materialize(self):
        copies.append("stacked copy")
        return real_mat(self)

    monkeypatch.setattr(layer_stack.LayerStack, "_each", each)
    monkeypatch.setattr(layer_stack.LayerStack, "materialize", materialize)
    # a threshold every layer passes, so spikes and their contributions are read
    threshold = min(float(cache[act_name(h, 0)].float().abs().quantile(0.99))
                    for h in ("mlp_post", "mlp_out"))
    spikes = mlp_spikes(cache, lazy, threshold=threshold)
    sets = super_neuron_sets(cache, lazy, threshold=threshold)
    assert copies == []
    want = mlp_spikes(cache, full, threshold=threshold)
    assert torch.equal(spikes.weight, want.weight) and spikes.weight.dtype == torch.float32
    want_sets = super_neuron_sets(cache, full, threshold=threshold)
    assert len(sets.spikes) > 0 and sets.spikes == want_sets.spikes
    # the result holds the weights themselves (no copy kept with it)
    hf_ptrs = {p.untyped_storage().data_ptr() for p in model.original_model.parameters()}
    assert all(t.untyped_storage().data_ptr() in hf_ptrs for t in sets.w_out._layers)
    for layer in range(n_layers):
        assert sets.set_of(layer, 3).to_dict() == want_sets.set_of(layer, 3).to_dict()
