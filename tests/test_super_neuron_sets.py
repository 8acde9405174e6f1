"""Complete super-neuron sets: hand-built caches with planted writers, checked against sums done
by hand (numpy), and the census field on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mechsink.measure import SuperNeuronSets, super_neuron_sets


def _as_cache(suffix: str, stacked: torch.Tensor) -> dict[str, torch.Tensor]:
    return {f"blocks.{layer}.{suffix}": stacked[layer] for layer in range(stacked.shape[0])}


def _planted(batch: int = 3):
    """Layer 1 writes channel 5 at position 0 through neurons 7 (60%), 2 (30%) and 11 (9%),
    plus small noise from every other neuron; layer 0 writes nothing large."""
    gen = torch.Generator().manual_seed(0)
    n_layer, n_pos, d_mlp, d_model = 2, 4, 16, 8
    post = (torch.rand(n_layer, batch, n_pos, d_mlp, generator=gen) - 0.5) * 0.1
    w_out = torch.randn(n_layer, d_mlp, d_model, generator=gen) * 0.01
    w_out[1, [7, 2, 11], 5] = 1.0
    post[1, :, 0, 7] = 600.0
    post[1, :, 0, 2] = 300.0
    post[1, :, 0, 11] = 90.0
    out = torch.einsum("lbpn,lnd->lbpd", post, w_out)
    resid = torch.cumsum(out, 0) + 0.1 * torch.randn(n_layer, batch, n_pos, d_model,
                                                     generator=gen)
    resid[:, :, 1:, 5] = 0.0  # channel 5 is massive at position 0 only
    cache = {**_as_cache("mlp.hook_post", post), **_as_cache("hook_mlp_out", out),
             **_as_cache("hook_resid_post", resid)}
    return cache, post, out, w_out


def test_complete_set_is_the_planted_set_in_rank_order():
    cache, post, out, w_out = _planted()
    found = super_neuron_sets(cache, w_out)
    assert found.massive_channels() == [5]
    sets = found.sets()
    assert [(s.layer, s.channel) for s in sets] == [(1, 5)]
    s = sets[0]
    assert s.units == [7, 2, 11]  # 60% + 30% < 95%, the third one is needed
    assert s.complete
    # by hand: the MLP's mean write at position 0 and each neuron's share
    write = (post[1, :, 0].double().numpy() @ w_out[1, :, 5].double().numpy()).mean()
    assert s.write == pytest.approx(write, rel=1e-5)
    np.testing.assert_allclose([c for _, c in s.neurons], [600.0, 300.0, 90.0], rtol=1e-4)
    assert s.explained == pytest.approx(990.0 / write, rel=1e-4)
    # every neuron that spikes (|post| > 50 where the output spikes) is listed, not only the top
    spiking = {(n.layer, n.neuron, n.channel, n.position) for n in found.spiking_neurons()}
    assert spiking == {(1, 7, 5, 0), (1, 2, 5, 0), (1, 11, 5, 0)}


def test_coverage_decides_the_size_and_merge_is_exact():
    cache, _, _, w_out = _planted(batch=4)
    assert super_neuron_sets(cache, w_out, coverage=0.5).sets()[0].units == [7]
    assert super_neuron_sets(cache, w_out, coverage=0.85).sets()[0].units == [7, 2]
    halves = [super_neuron_sets({k: v[a:b] for k, v in cache.items()}, w_out)
              for a, b in ((0, 1), (1, 4))]
    merged = SuperNeuronSets.merge(halves).to_dict()
    assert merged == super_neuron_sets(cache, w_out).to_dict()


def test_census_lists_super_neuron_sets(llama_tiny):
    from mechsink.measure.census import SCHEMA, census

    c = census(llama_tiny, ["random"], ["bos"], n=2, seq_len=8)
    data = c.to_dict()
    assert data["schema"] == SCHEMA == "mechsink-census/2"
    block = data["runs"][0]["super_neuron_sets"]
    assert block["criterion"]["coverage"] == 0.95
    # the set channels are massive channels at position 0 in the census's own massive report
    massive0 = {a["channel"] for a in data["runs"][0]["massive_activations_layer_median"]
                if a["position"] == 0}
    assert {s["channel"] for s in block["sets"]} <= massive0



def test_a_chunk_keeps_only_its_own_numbers(llama_tiny):
    """The census keeps one measure_cache result per chunk until it merges them: no tensor in
    it may hold on to a cache-sized storage (a slice of the stacked cache did: 3.2 GB peak for
    SmolLM2's census instead of 2.5 GB)."""
    import dataclasses

    from mechsink.inputs.prompts import make_prompts
    from mechsink.measure.census import measure_cache, needed_hooks
    from mechsink.model import down_projection, head_output_weights

    tokens = make_prompts(llama_tiny, "random", "bos", n=2, seq_len=8).tokens
    with torch.no_grad():
        _, cache = llama_tiny.run_with_cache(tokens, names_filter=needed_hooks(llama_tiny))
    w_out = down_projection(llama_tiny)
    part = measure_cache(cache, w_out=w_out, w_o=head_output_weights(llama_tiny))

    def tensors(x, path):
        if isinstance(x, torch.Tensor):
            yield path, x
        elif dataclasses.is_dataclass(x):
            for f in dataclasses.fields(x):
                yield from tensors(getattr(x, f.name), f"{path}.{f.name}")
        elif isinstance(x, dict):
            for k, v in x.items():
                yield from tensors(v, f"{path}[{k!r}]")
        elif isinstance(x, (list, tuple)):
            for i, v in enumerate(x):
                yield from tensors(v, f"{path}[{i}]")

    found = list(tensors(part, "part"))
    assert any(p.endswith("].post0") for p, _ in found)  # the super-neuron inputs
    oversized = {p: (t.untyped_storage().nbytes(), t.numel() * t.element_size())
                 for p, t in found if not p.endswith(".w_out")  # w_out: the model's weights
                 and t.untyped_storage().nbytes() > t.numel() * t.element_size()}
    assert not oversized
