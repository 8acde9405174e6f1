"""Parallel attention + MLP blocks (Cohere, Cohere 2, Falcon, GPT-J, GPT-NeoX with
``use_parallel_residual``, Phi): activation patching of every site kind equals a plain-hook
reference (the corrupted input run once per patch with the clean activation written in), and
``resid_mid``, which such a block does not have, is refused in one line.

In a parallel block ``x_out = x + attn(ln1(x)) + mlp(ln2(x))``: the MLP reads the block's input,
not ``x + attn_out``, so there is no residual "between" attention and MLP to patch.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.architectures import expected
from tests.architectures.test_architectures import TOL, _corrupted, _logit_metric, rel

pytestmark = pytest.mark.slow

PARALLEL = ("CohereForCausalLM", "Cohere2ForCausalLM", "FalconForCausalLM", "GPTJForCausalLM",
            "GPTNeoXForCausalLM", "PhiForCausalLM")
#: every site kind of mechsink.patching.sites (whole layer / head / one neuron: all_pos)
SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v",
         "pattern", "neuron")
HOOKS = {"resid_pre": "hook_resid_pre", "resid_post": "hook_resid_post",
         "attn_out": "hook_attn_out", "mlp_out": "hook_mlp_out", "z": "attn.hook_z",
         "q": "attn.hook_q", "k": "attn.hook_k", "v": "attn.hook_v",
         "pattern": "attn.hook_pattern", "neuron": "mlp.hook_post"}
NEURON = 3  # the one neuron patched per layer (L<layer>N3): every neuron would be 256 forwards


def _units(model: Any, site: str) -> list[int | None]:
    from mechsink.model import n_kv_heads

    if site in ("z", "q", "pattern"):
        return list(range(int(model.cfg.n_heads)))
    if site in ("k", "v"):
        return list(range(n_kv_heads(model)))
    return [NEURON] if site == "neuron" else [None]


@torch.no_grad()
def by_hand(model: Any, clean: torch.Tensor, corrupted: torch.Tensor, site: str
            ) -> torch.Tensor:
    """[layer, unit] (or [layer]): the corrupted run with one clean slice written in."""
    n_layers = int(model.cfg.n_layers)
    names = [f"blocks.{lay}.{HOOKS[site]}" for lay in range(n_layers)]
    _, cache = model.run_with_cache(clean, names_filter=names)
    rows = []
    for name in names:
        row = []
        for unit in _units(model, site):
            def patch(act: torch.Tensor, hook: Any, unit: int | None = unit,
                      src: torch.Tensor = cache[name]) -> torch.Tensor:
                new = act.clone()
                if unit is None:
                    new[:] = src
                elif site == "pattern":
                    new[:, unit] = src[:, unit]
                else:
                    new[:, :, unit] = src[:, :, unit]
                return new

            row.append(float(_logit_metric(model.run_with_hooks(
                corrupted, fwd_hooks=[(name, patch)]))))
        rows.append(row)
    out = torch.tensor(rows, dtype=torch.float64)
    return out[:, 0] if _units(model, site) == [None] else out


@pytest.mark.parametrize(("arch", "site"), expected.cases("parallel", PARALLEL, SITES))
def test_parallel_block_sites_equal_plain_hooks(suite, arch, site, record_property):
    """activation_patch at every site kind of a parallel block equals the plain-hook patch;
    resid_mid is refused with the reason (by patching and by ablate); and the patches do
    something (a patch that never reaches the output would pass as "no effect")."""
    from mechsink.errors import BadInputError
    from mechsink.interventions import ablate
    from mechsink.patching import activation_patch

    m = suite.get(arch)
    assert m.bridge.cfg.parallel_attn_mlp, f"{arch} is not a parallel block here"
    clean = m.tokens[:1]
    corrupted = _corrupted(clean)
    if site == "resid_mid":
        with pytest.raises(BadInputError, match="parallel") as info:
            activation_patch(m.bridge, clean, corrupted, "resid_mid", _logit_metric)
        assert "\n" not in str(info.value)
        with pytest.raises(BadInputError, match="parallel"):
            ablate(m.bridge, "resid_mid", 1, mode="zero")
        record_property("diff", 0.0)
        return
    spec = f"L{{}}N{NEURON}" if site == "neuron" else f"{site}_all_pos"
    want = by_hand(m.bridge, clean, corrupted, site)
    if site == "neuron":
        got = torch.stack([activation_patch(m.bridge, clean, corrupted,
                                            spec.format(lay) + "_all_pos",
                                            _logit_metric).values.reshape(-1)
                           for lay in range(int(m.bridge.cfg.n_layers))])
    else:
        got = activation_patch(m.bridge, clean, corrupted, spec, _logit_metric).values
    got = got.reshape(want.shape)
    record_property("diff", rel(got, want))
    assert rel(got, want) <= TOL
    with torch.no_grad():
        base = float(_logit_metric(m.bridge(corrupted)))
    assert (want - base).abs().max() > 1e-6, "no patch changed the metric"
