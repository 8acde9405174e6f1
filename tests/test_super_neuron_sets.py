"""Complete super-neuron sets: hand-built caches with planted writers, checked against sums done
by hand (numpy), and the census field on a tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from parity_refs import torch_hooks

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


# --- after a post-MLP norm (Gemma 2/3): the set is of what reaches the residual stream ---------

GEMMA_CHANNEL, GEMMA_LOUD = 7, 5  # the norm's gain blows channel 7 up; neuron 5 dominates y


def _planted_gemma(arch: str = "Gemma3ForCausalLM"):
    """A tiny random-init Gemma 2 or 3 (transformers config) whose block 0 post-feedforward norm
    multiplies channel 7 by 3e4 and whose neuron 5 writes 30x louder than the rest: it dominates
    the down projection's output (and its share of channel 7) but, under the norm, zeroing it
    only changes the direction the norm rescales."""
    from tests.architectures.builder import build_model

    hf = build_model(arch)
    layer = hf.model.layers[0]
    with torch.no_grad():
        layer.post_feedforward_layernorm.weight[GEMMA_CHANNEL] = 3e4
        layer.mlp.down_proj.weight[:, GEMMA_LOUD] *= 30.0
    return hf


def _hf_write(hf, tokens, zero: list[int]) -> torch.Tensor:
    """transformers' own forward: block 0's post-feedforward-norm output in channel 7 at
    position 0, per sequence, with down-projection inputs ``zero`` set to 0 at position 0."""
    layer = hf.model.layers[0]
    seen = {}

    def pre(module, args):
        x = args[0].clone()
        x[:, 0, zero] = 0.0
        return (x,)

    def post(module, args, out):
        seen["out"] = out[:, 0, GEMMA_CHANNEL].detach().double()

    with torch_hooks(layer.mlp.down_proj.register_forward_pre_hook(pre),
                     layer.post_feedforward_layernorm.register_forward_hook(post)), \
            torch.no_grad():
        hf(tokens)
    return seen["out"]


@pytest.mark.parametrize("arch", ["Gemma3ForCausalLM", "Gemma2ForCausalLM"])
def test_sets_after_a_post_mlp_norm_are_of_the_residual_write(arch):
    import mechsink
    from mechsink.measure.super_neurons import SET_HOOKS
    from mechsink.model import down_projection, down_projection_bias, post_mlp_norms

    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 64, (6, 12), generator=gen)  # no BOS: its embedding is the pad's
    model = mechsink.wrap(_planted_gemma(arch))
    with torch.no_grad():
        _, cache = model.run_with_cache(
            tokens, names_filter=lambda h: any(h.endswith(s) for s in SET_HOOKS))
    found = super_neuron_sets(cache, down_projection(model), post_norms=post_mlp_norms(model),
                              b_out=down_projection_bias(model))
    assert (0, GEMMA_CHANNEL) in found.channels()
    s = found.set_of(0, GEMMA_CHANNEL)
    assert s.normed and s.complete and found.to_dict()["super_neuron_sets"]["criterion"][
        "post_mlp_norm_blocks"] == [0, 1]

    ref = _planted_gemma(arch)  # an untouched twin: transformers' own modules, no bridge
    clean = _hf_write(ref, tokens, [])
    assert s.write == pytest.approx(float(clean.mean()), rel=1e-4)
    # the raw down-projection shares (numpy, from transformers' own down_proj input) name
    # neuron 5 alone ...
    acts = {}

    def keep(module, args, out):
        acts["post"] = args[0][:, 0].detach().double()

    with torch_hooks(ref.model.layers[0].mlp.down_proj.register_forward_hook(keep)), \
            torch.no_grad():
        ref(tokens)
    contrib = (acts["post"] * ref.model.layers[0].mlp.down_proj.weight[GEMMA_CHANNEL].double()
               ).mean(0).detach().numpy()
    assert int(np.argmax(np.sign(contrib.sum()) * contrib)) == GEMMA_LOUD
    assert list(s.down_units) == [GEMMA_LOUD]
    # ... but zeroing it in transformers' forward leaves most of the residual write standing
    removed_raw = 1 - float(_hf_write(ref, tokens, [GEMMA_LOUD]).mean() / clean.mean())
    assert removed_raw < 0.95
    # the set found on the residual write is another set, and zeroing it does what it says
    assert s.units != [GEMMA_LOUD]
    removed = 1 - float(_hf_write(ref, tokens, s.units).mean() / clean.mean())
    assert removed == pytest.approx(s.explained, abs=1e-4) and removed >= 0.95
    if len(s.units) > 1:  # the greedy set is no larger than it needs: one less stops short
        fewer = 1 - float(_hf_write(ref, tokens, s.units[:-1]).mean() / clean.mean())
        assert fewer < 0.95
