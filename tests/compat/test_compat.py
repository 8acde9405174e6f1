"""Compatibility suite: a HookedTransformer gives the same numbers as a TransformerBridge.

The same tiny GPT-2 and Llama weights are built as a bridge (``mechsink.load_model``) and as a
HookedTransformer (TransformerLens's own weight conversion, raw and unfolded), and every public
entry point that takes a model (forward, census, activation / attribution / path patching with
prefix reuse, interventions, an experiment) must agree within 1e-4 with the reference numbers:
the file ``MECHSINK_COMPAT_REFERENCE`` names (written by ``reference.py`` with the main
environment's bridge, as ``make test`` does), else this environment's own bridge.

``make test`` runs this suite in the main environment (TransformerLens 4: bridge only, so the
HookedTransformer cases are skipped there) and again under TransformerLens 3.9 and 2.18 in the
environments ``make compat-envs`` builds under ``.venv/compat/``. ``MECHSINK_COMPAT_TABLE``: a
folder to write each case's per-entry-point differences to (for the report table).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from . import _compat

TL = _compat.transformer_lens_version()


@pytest.fixture(scope="module")
def reference() -> dict:
    path = os.environ.get("MECHSINK_COMPAT_REFERENCE")
    if path:
        return torch.load(path, weights_only=False)
    if not _compat.has_bridge():
        pytest.skip(f"TransformerLens {TL} has no TransformerBridge and no reference file was "
                    "given (MECHSINK_COMPAT_REFERENCE): run it through `make test`.")
    return {"transformer_lens": TL,
            "families": {f: _compat.compute(_compat.bridge(f)) for f in _compat.FAMILIES}}


def _build(kind: str, family: str):
    if kind == "hooked":
        if not _compat.has_hooked_transformer():
            pytest.skip(f"TransformerLens {TL} has no HookedTransformer (removed in 4.0); "
                        "`make test` runs these cases under TransformerLens 3.9 and 2.18.")
        return _compat.hooked_transformer(family)
    if not _compat.has_bridge():
        pytest.skip(f"TransformerLens {TL} has no TransformerBridge (added in 3.0).")
    if int(TL.split(".")[0]) < 4:  # what a user gets: an error that names the fix
        from mechsink.errors import MissingDependencyError

        with pytest.raises(MissingDependencyError, match="needs TransformerLens 4"):
            _compat.bridge(family)
        pytest.skip(f"TransformerLens {TL}'s bridge is refused (checked): use a HookedTransformer")
    return _compat.bridge(family)


@pytest.mark.parametrize("family", _compat.FAMILIES)
@pytest.mark.parametrize("kind", ["bridge", "hooked"])
def test_same_numbers(request: pytest.FixtureRequest, kind: str, family: str) -> None:
    if kind == "bridge" and not os.environ.get("MECHSINK_COMPAT_REFERENCE"):
        pytest.skip("the reference would be this environment's own bridge")
    model = _build(kind, family)
    reference = request.getfixturevalue("reference")
    got = _compat.compute(model)
    ref = reference["families"][family]
    rows = {}
    for name, want in ref.items():
        value = got.get(name, "missing")
        rows[name] = value if isinstance(value, str) else _compat.max_difference(value, want)
    table = os.environ.get("MECHSINK_COMPAT_TABLE")
    if table:
        Path(table).mkdir(parents=True, exist_ok=True)
        (Path(table) / f"{kind}-{TL}-{family}.json").write_text(json.dumps(
            {"kind": kind, "transformer_lens": TL, "family": family,
             "reference_transformer_lens": reference["transformer_lens"], "max_abs_diff": {
                 k: (v if isinstance(v, str) else (None if math.isinf(v) else v))
                 for k, v in rows.items()}}, indent=1))
    bad = {k: v for k, v in rows.items() if isinstance(v, str) or not v <= _compat.TOLERANCE}
    assert not bad, f"{kind} (TransformerLens {TL}) differs from the reference: {bad}"


@pytest.mark.parametrize("family", _compat.FAMILIES)
def test_hooked_transformer_is_the_transformers_model(family: str) -> None:
    """The HookedTransformer under test computes what the plain transformers model computes
    (so the comparison above is against an independent implementation of the same weights)."""
    if not _compat.has_hooked_transformer():
        pytest.skip(f"TransformerLens {TL} has no HookedTransformer (removed in 4.0).")
    hf, _ = _compat.hf_model(family)
    hooked = _compat.hooked_transformer(family)
    tokens = torch.randint(0, 50000, (2, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        diff = (hooked(tokens) - hf(tokens).logits).abs().max().item()
    assert diff < _compat.TOLERANCE


@pytest.mark.parametrize("family", _compat.FAMILIES)
def test_hooked_transformer_prefix_reuse(family: str) -> None:
    """A HookedTransformer records keys/values, and a run of the suffix from a layer that
    reads the prefix from them equals the full forward (TransformerLens's own, unpatched)."""
    if not _compat.has_hooked_transformer():
        pytest.skip(f"TransformerLens {TL} has no HookedTransformer (removed in 4.0).")
    from mechsink.model import act_name, run_from_layer, run_with_kv, supports_prefix_reuse

    model = _compat.hooked_transformer(family)
    assert supports_prefix_reuse(model)
    tokens = torch.randint(0, 50000, (2, 12), generator=torch.Generator().manual_seed(4))
    name = act_name("resid_pre", 1)
    with torch.no_grad():
        logits, acts, kv = run_with_kv(model, tokens, [name])
        assert kv is not None
        full, cache = model.run_with_cache(tokens)
        suffix = run_from_layer(model, acts[name][:, 5:].repeat(3, 1, 1), 1, prefix=(kv, 5))
    assert suffix is not None
    assert (logits - full).abs().max().item() < 1e-5
    assert (suffix - full[:, 5:].repeat(3, 1, 1)).abs().max().item() < _compat.TOLERANCE
    assert torch.equal(acts[name], cache[name])


@pytest.mark.parametrize("family", _compat.FAMILIES)
def test_attention_scale_on_a_hooked_transformer(family: str) -> None:
    """attention_scale is what a HookedTransformer divides q . k by (its own hook_attn_scores)."""
    if not _compat.has_hooked_transformer():
        pytest.skip(f"TransformerLens {TL} has no HookedTransformer (removed in 4.0).")
    from mechsink.model import act_name, attention_scale, n_kv_heads

    model = _compat.hooked_transformer(family)
    tokens = torch.randint(0, 50000, (2, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    group = int(model.cfg.n_heads) // n_kv_heads(model)
    for layer in range(int(model.cfg.n_layers)):
        rot_q, rot_k = act_name("rot_q", layer), act_name("rot_k", layer)
        q = cache[rot_q] if rot_q in cache else cache[act_name("q", layer)]
        k = cache[rot_k] if rot_k in cache else cache[act_name("k", layer)]
        if k.shape[2] != q.shape[2]:
            k = k.repeat_interleave(group, dim=2)
        dots = torch.einsum("bqhd,bkhd->bhqk", q, k) / attention_scale(model, layer)
        scores = cache[act_name("attn_scores", layer)]
        visible = torch.ones(9, 9, dtype=torch.bool).tril().expand_as(scores)
        assert (dots[visible] - scores[visible]).abs().max().item() < 1e-4
