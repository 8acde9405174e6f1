"""Per-head queries, keys and values, before and after the rotary embedding, against the ones
transformers itself computes (its own fused projection, split and rotary embedding), on every
architecture; and an edit of the rotated keys reaches the output as the same edit made inside
transformers does.

transformers' vectors are recorded where its attention uses them: the arguments of the modeling
module's ``eager_attention_forward`` (rotated query and key, value; ``[batch, heads, pos,
d_head]``), the inputs of its ``apply_rotary_pos_emb(q, k, cos, sin)`` (before rotation) and
its outputs where there is no eager function (Falcon), and the fused split itself where the
attention has one (``_split_heads``, ``_reshape``: Falcon, Bloom).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests.architectures import expected
from tests.architectures.test_architectures import ARCHS, TOL, rel

pytestmark = pytest.mark.slow

Edit = Callable[[int, str, Tensor], Tensor]  # (call number, "q"/"k"/"v", tensor) -> tensor
#: transformers' names of a per-head query/key norm: the rotary embedding's input is then the
#: normalised vector, while hook_q/k are the projection's output (before that norm)
QK_NORMS = ("q_norm", "k_norm", "q_layernorm", "k_layernorm", "query_layernorm",
            "key_layernorm", "query_norm", "key_norm")


@contextmanager
def _patched(owner: Any, name: str, make: Callable[[Any], Any]) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, make(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


@contextmanager
def recorded(hf: torch.nn.Module, edit: Edit | None = None) -> Iterator[dict[str, list]]:
    """transformers' own q/k/v per attention call, in call order: ``post`` (what the
    attention uses: rotated q, k and v), ``pre`` (q, k before rotation), ``split`` (q, k, v
    from the fused projection). ``edit`` may change the rotated vectors on their way in."""
    modeling = sys.modules[type(hf).__module__]
    out: dict[str, list] = {"post": [], "pre": [], "split": []}
    patches = []
    eager = getattr(modeling, "eager_attention_forward", None)
    rotary = getattr(modeling, "apply_rotary_pos_emb", None)
    joint = rotary is not None and list(inspect.signature(rotary).parameters)[:2] == ["q", "k"]
    if eager is not None:
        def make_eager(orig: Any) -> Any:
            def rec(module, query, key, value, *a, **kw):
                n = len(out["post"])
                if edit is not None:
                    query, key = edit(n, "q", query), edit(n, "k", key)
                # transformers' signature: (module, query, key, value, attention_mask, scaling)
                scaling = kw.get("scaling", a[1] if len(a) > 1 else None)
                if scaling is None:
                    scaling = getattr(module, "scaling", None) or query.shape[-1] ** -0.5
                out["post"].append({"q": query, "k": key, "v": value, "scaling": scaling})
                return orig(module, query, key, value, *a, **kw)
            return rec
        patches.append((modeling, "eager_attention_forward", make_eager))
    if joint:
        def make_rotary(orig: Any) -> Any:
            def rec(q, k, *a, **kw):
                out["pre"].append({"q": q, "k": k})
                q2, k2 = orig(q, k, *a, **kw)
                if eager is None:  # Falcon: the rotated vectors go straight to its attention
                    n = len(out["post"])
                    if edit is not None:
                        q2, k2 = edit(n, "q", q2), edit(n, "k", k2)
                    out["post"].append({"q": q2, "k": k2})
                return q2, k2
            return rec
        patches.append((modeling, "apply_rotary_pos_emb", make_rotary))
    for module in hf.modules():
        for split in ("_split_heads", "_reshape"):
            if split in type(module).__dict__ and "Attention" in type(module).__name__:
                def make_split(orig: Any) -> Any:
                    def rec(fused):
                        q, k, v = orig(fused)
                        out["split"].append({"q": q, "k": k, "v": v})
                        if eager is None and not joint:  # Bloom: used as split
                            n = len(out["post"])
                            if edit is not None:
                                q, k = edit(n, "q", q), edit(n, "k", k)
                            out["post"].append({"q": q, "k": k, "v": v})
                        return q, k, v
                    return rec
                patches.append((module, split, make_split))
    with _stack(patches):
        yield out


@contextmanager
def _stack(patches: list) -> Iterator[None]:
    if not patches:
        yield
        return
    owner, name, make = patches[0]
    with _patched(owner, name, make), _stack(patches[1:]):
        yield


def _tl(x: Tensor, heads_first: bool = True) -> Tensor:
    """transformers' [batch, heads, pos, d] as TransformerLens's [batch, pos, heads, d]."""
    return x.transpose(1, 2) if heads_first else x


def scored(cache: Any, suffix: str, layer: int) -> Tensor:
    """A scored-q/k hook (:func:`mechsink.measure.keys.scored_qk_hooks`) as ``[batch, pos,
    head, d_head]`` (the q/k norm's outputs are ``[batch, head, pos, d_head]``)."""
    from mechsink.measure.keys import NORMED_HOOKS

    act = cache[f"blocks.{layer}.{suffix}"]
    return act.transpose(1, 2) if suffix in NORMED_HOOKS else act


def qkv_pairs(m: Any) -> list[tuple[str, Tensor, Tensor]]:
    """(what, mechsink's, transformers') for every vector kind transformers showed. The scored
    queries are compared as they enter the dot product times the scale: mechsink's divided by
    :func:`mechsink.model.attention_scale`, transformers' times the ``scaling`` its eager
    attention gets (OPT scales its queries before the attention and passes 1)."""
    from mechsink.measure.keys import scored_qk_hooks
    from mechsink.model import attention_scale

    n_layers = int(m.bridge.cfg.n_layers)
    with torch.no_grad(), recorded(m.hf) as ref:
        m.hf(m.tokens)
    with torch.no_grad():
        _, cache = m.bridge.run_with_cache(m.tokens)
    hooks = dict(zip("qk", scored_qk_hooks(m.bridge), strict=True))
    qk_normed = any(n.rsplit(".", 1)[-1] in QK_NORMS for n, _ in m.hf.named_modules())
    pairs = []
    for lay in range(n_layers):
        post = ref["post"][lay] if len(ref["post"]) == n_layers else None
        if post is not None:
            for k in ("q", "k"):
                want = _tl(post[k])
                if k == "q" and "scaling" in post:  # mechsink's q / scale = transformers' q * s
                    want = want * float(post["scaling"]) * attention_scale(m.bridge, lay)
                pairs.append((f"blocks.{lay}.{hooks[k]}", scored(cache, hooks[k], lay), want))
            if "v" in post:
                pairs.append((f"blocks.{lay}.attn.hook_v", cache[f"blocks.{lay}.attn.hook_v"],
                              _tl(post["v"])))
        if len(ref["pre"]) == n_layers and not qk_normed:
            for k in ("q", "k"):
                want = _tl(ref["pre"][lay][k])
                got = cache[f"blocks.{lay}.attn.hook_{k}"][..., :want.shape[-1]]
                pairs.append((f"blocks.{lay}.attn.hook_{k} (before rotary)", got, want))
        if len(ref["split"]) == n_layers:
            for k, v in ref["split"][lay].items():
                want = v if v.shape[1] == m.tokens.shape[1] else _tl(v)
                pairs.append((f"blocks.{lay}.attn.hook_{k} (fused split)",
                              cache[f"blocks.{lay}.attn.hook_{k}"][..., :want.shape[-1]], want))
    if not pairs:
        raise AssertionError("transformers showed no q/k/v here (no eager attention function, "
                             "rotary function or fused split to record)")
    return pairs


@pytest.mark.parametrize("arch", expected.cases("qkv", ARCHS))
def test_qkv_equal_transformers(suite, arch, record_property):
    """hook_q/k/v (before rotary; unless a q/k norm sits between) and hook_rot_q/k (after)
    equal transformers' own vectors,
    and the census's key-bias cosine is the cosine of transformers' rotated q and k."""
    from mechsink.measure.keys import key_bias_cosine, scored_qk_hooks

    m = suite.get(arch)
    pairs = qkv_pairs(m)
    diffs = {what: rel(got, want) if got.shape == want.shape else float("inf")
             for what, got, want in pairs}
    record_property("diff", max(diffs.values()))
    assert max(diffs.values()) <= TOL, {k: v for k, v in diffs.items() if v > TOL}
    with torch.no_grad(), recorded(m.hf) as ref:
        m.hf(m.tokens)
        _, cache = m.bridge.run_with_cache(m.tokens)
    if len(ref["post"]) == int(m.bridge.cfg.n_layers):
        got = key_bias_cosine(cache, scored_qk_hooks(m.bridge)).first
        q = torch.stack([F.normalize(r["q"], dim=-1) for r in ref["post"]], 1)  # b l h p d
        k = torch.stack([F.normalize(r["k"], dim=-1) for r in ref["post"]], 1)
        k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
        want = (q[:, :, :, 1:] * k[:, :, :, :1]).sum(-1).mean(-1)  # queries i > 0, key 0
        assert rel(got, want) <= TOL


@pytest.mark.parametrize("arch", expected.cases("qkv_edit", ARCHS))
def test_rotated_key_edit_equals_transformers(suite, arch, record_property):
    """Scaling the scored key at position 0 in block 1 by 10 (hook_rot_k; hook_k on a model
    without rotary; hook_k_normed where the q/k norm follows the rotary embedding) gives
    transformers' logits with the same edit on the key its attention uses."""
    from mechsink.interventions import ablate, applied
    from mechsink.measure.keys import NORMED_HOOKS, scored_qk_hooks

    m = suite.get(arch)
    suffix = scored_qk_hooks(m.bridge)[1]
    name = f"blocks.1.{suffix}"
    # mechsink's own edit where its ablate takes the hook ([batch, pos, kv_head, d]): a hook
    # the bridge never fires (JetMoE's hook_rot_k) is refused in one line, not dropped
    edits = [] if suffix in NORMED_HOOKS else [
        ablate(m.bridge, name, mode="scale", scale=10.0, positions=[0])]

    def key0_times_10(act: Tensor, hook: Any) -> Tensor:
        out = act.clone()
        if suffix in NORMED_HOOKS:  # [batch, kv_head, pos, d]
            out[:, :, 0] *= 10.0
        else:
            out[:, 0] *= 10.0
        return out

    def edit(call: int, what: str, x: Tensor) -> Tensor:
        if call != 1 or what != "k":
            return x
        x = x.clone()
        x[:, :, 0] *= 10.0  # [batch, kv_heads, pos, d]
        return x

    with torch.no_grad():
        if edits:
            with applied(m.bridge, edits):
                got = m.bridge(m.tokens)
        else:
            got = m.bridge.run_with_hooks(m.tokens, fwd_hooks=[(name, key0_times_10)])
        with recorded(m.hf, edit) as ref:
            want = m.hf(m.tokens).logits
    assert len(ref["post"]) == int(m.bridge.cfg.n_layers), "transformers' attention not seen"
    record_property("diff", rel(got, want))
    assert rel(got, want) <= TOL
    assert rel(got, m.logits) > 1e-3, "the edit did not change the logits"


def test_wrap_of_a_users_bridge_fires_the_rotary_hooks(suite):
    """A TransformerBridge the user booted themselves gets the same hooks from mechsink.wrap
    (GPT-NeoX: hook_rot_q equals transformers' rotated queries)."""
    import transformers
    from transformer_lens.model_bridge import TransformerBridge

    import mechsink
    from mechsink.model.patches.offline import offline
    from mechsink.model.patches.tokenizer_lookup import no_tokenizer_lookup

    m = suite.get("GPTNeoXForCausalLM")
    plain = transformers.AutoModelForCausalLM.from_pretrained(
        str(m.folder), attn_implementation="eager").eval()
    with offline(), no_tokenizer_lookup():
        bridge = TransformerBridge.boot_transformers("tiny", hf_model=plain)
    bridge.enable_compatibility_mode(no_processing=True, disable_warnings=True)
    wrapped = mechsink.wrap(bridge)
    with torch.no_grad(), recorded(m.hf) as ref:  # the bridge recomputes attention itself
        m.hf(m.tokens)
        _, cache = wrapped.run_with_cache(m.tokens, names_filter="blocks.0.attn.hook_rot_q")
    assert "blocks.0.attn.hook_rot_q" in cache.keys()
    assert rel(cache["blocks.0.attn.hook_rot_q"], _tl(ref["post"][0]["q"])) <= TOL
