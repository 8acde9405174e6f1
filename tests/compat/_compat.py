"""The compatibility suite's shared code: the same tiny models as a TransformerBridge and as a
HookedTransformer, and every public entry point's numbers on one of them.

Imported by ``test_compat.py`` (under any TransformerLens version) and run as a script by
``reference.py`` (in the main environment, whose bridge gives the reference numbers).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

FAMILIES = ("gpt2-tiny", "llama-tiny")
TOLERANCE = 1e-4
SEED = 0


def transformer_lens_version() -> str:
    from importlib.metadata import version

    return version("transformer-lens")


def has_hooked_transformer() -> bool:
    try:
        from transformer_lens import HookedTransformer  # noqa: F401
    except ImportError:
        return False
    return True


def has_bridge() -> bool:
    try:
        from transformer_lens.model_bridge import TransformerBridge  # noqa: F401
    except ImportError:
        return False
    return True


def hf_model(family: str) -> tuple[Any, Any]:
    """The plain transformers model and tokenizer behind ``random:<family>`` (seed 0)."""
    from mechsink.model.zoo import random_hf_model

    return random_hf_model(family, seed=SEED)


def bridge(family: str) -> Any:
    from mechsink import load_model

    return load_model(f"random:{family}", device="cpu", seed=SEED)


def hooked_transformer(family: str) -> Any:
    """The same weights as a HookedTransformer: raw, unfolded (no LayerNorm folding, no
    centring, no value-bias folding), built from the transformers model by TransformerLens's
    own weight conversion."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import (
        convert_gpt2_weights,
        convert_llama_weights,
    )

    hf, tok = hf_model(family)
    c = hf.config
    arch = type(hf).__name__
    if arch == "GPT2LMHeadModel":
        d: dict[str, Any] = dict(
            d_model=c.n_embd, d_head=c.n_embd // c.n_head, n_heads=c.n_head, d_mlp=4 * c.n_embd,
            n_layers=c.n_layer, n_ctx=c.n_positions, eps=c.layer_norm_epsilon,
            d_vocab=c.vocab_size, act_fn=c.activation_function, normalization_type="LN",
            positional_embedding_type="standard")
        convert: Callable[..., dict] = convert_gpt2_weights
    elif arch == "LlamaForCausalLM":
        d = dict(
            d_model=c.hidden_size, d_head=c.hidden_size // c.num_attention_heads,
            n_heads=c.num_attention_heads, d_mlp=c.intermediate_size,
            n_layers=c.num_hidden_layers, n_ctx=c.max_position_embeddings, eps=c.rms_norm_eps,
            d_vocab=c.vocab_size, act_fn=c.hidden_act, n_key_value_heads=c.num_key_value_heads,
            normalization_type="RMS", positional_embedding_type="rotary",
            rotary_adjacent_pairs=False, rotary_dim=c.hidden_size // c.num_attention_heads,
            final_rms=True, gated_mlp=True, rotary_base=10000)
        convert = convert_llama_weights
    else:  # pragma: no cover - only the two families above are built
        raise ValueError(arch)
    cfg = HookedTransformerConfig(**d, original_architecture=arch, default_prepend_bos=False,
                                  device="cpu", dtype=torch.float32, model_name=family)
    model = HookedTransformer(cfg, tokenizer=tok, move_to_device=False)
    model.load_and_process_state_dict(
        convert(hf, cfg), fold_ln=False, center_writing_weights=False, center_unembed=False,
        fold_value_biases=False, refactor_factored_attn_matrices=False)
    return model.eval()


# --- numbers ---------------------------------------------------------------------------------


def flatten(obj: Any, prefix: str, out: dict[str, Tensor]) -> None:
    """Every number inside ``obj`` (tensors, floats, ints, dataclasses, dicts, lists) as
    float64 tensors keyed by path; strings and None are skipped."""
    if isinstance(obj, Tensor):
        out[prefix] = obj.detach().to(torch.float64).cpu().reshape(-1)
    elif isinstance(obj, bool):
        out[prefix] = torch.tensor([float(obj)], dtype=torch.float64)
    elif isinstance(obj, (int, float)):
        out[prefix] = torch.tensor([float(obj)], dtype=torch.float64)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            flatten(getattr(obj, f.name), f"{prefix}.{f.name}", out)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            flatten(v, f"{prefix}.{k}", out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            flatten(v, f"{prefix}[{i}]", out)


def _flat(obj: Any) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    flatten(obj, "", out)
    return out


def _patch(result: Any) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    results = result if isinstance(result, list) else [result]
    for i, r in enumerate(results):
        flatten(r.values, f"[{i}].values", out)
        flatten(r.clean_value, f"[{i}].clean", out)
        flatten(r.corrupted_value, f"[{i}].corrupted", out)
    return out


def _tokens(model: Any) -> tuple[Tensor, Tensor]:
    """A clean and a corrupted batch (2 sequences of 10 tokens, BOS first)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 20000, (4, 10), generator=g)
    ids[:, 0] = model.tokenizer.bos_token_id
    return ids[:2], ids[2:]


def entry_points(model: Any) -> dict[str, Callable[[], dict[str, Tensor]]]:
    """Each public entry point that takes a model, as a thunk giving its numbers."""
    from mechsink import viz
    from mechsink.discover.pipeline import discover
    from mechsink.experiments import gpt2_query_bias, p0_edges, structural_origin
    from mechsink.interventions import edits as iv
    from mechsink.interventions.readout import (
        dominant_super_neuron,
        massive_channel_sets,
        sink_readout,
    )
    from mechsink.measure.census import census
    from mechsink.patching import (
        LogitDiff,
        SinkScore,
        activation_patch,
        attribution_patch,
        path_patch,
    )
    from mechsink.patching.sites import parse_site

    clean, corrupted = _tokens(model)
    last = clean.shape[1] - 1
    diff = LogitDiff(int(clean[0, 1]), int(corrupted[0, 1]), position=last)
    sink = SinkScore(1, 0)
    heads = [f"L0H{h}" for h in range(int(model.cfg.n_heads))]

    def forward() -> dict[str, Tensor]:
        with torch.no_grad():
            return {"logits": model(clean).reshape(-1)}

    def run_census() -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        c = census(model, ["natural", "random"], ["bos", "nobos"], n=4, seq_len=16,
                   batch_size=4)
        for r in c.runs:
            flatten(dataclasses.replace(r, prompts={}), r.name, out)
        return out

    def patch(site: Any, metric: Any = sink, **kw: Any) -> Callable[[], dict[str, Tensor]]:
        return lambda: _patch(activation_patch(model, clean, corrupted, site, metric,
                                               prepend_bos=False, **kw))

    def interventions() -> dict[str, Tensor]:
        edits = {
            "ablate_mlp": [iv.ablate(model, "hook_mlp_out", 0, mode="position_mean",
                                              positions=[0])],
            "ablate_heads": [iv.ablate(model, "attn.hook_z", 1, units=[0, 1])],
            "self_attend": iv.attend_only_to_self(model, [1], 0),
            "scale_tokens": [iv.scale_tokens(model, 0, [0], 0.5)],
            "rotate_keys": [iv.rotate_keys(model, 1, seed=0)],
        }
        if model.cfg.positional_embedding_type == "standard":
            edits["no_query_bias"] = [iv.remove_query_bias(model, 1)]
        out = {}
        for name, e in edits.items():
            with torch.no_grad(), iv.applied(model, e) as m:
                out[name] = m(clean).reshape(-1)
        return out

    def readout() -> dict[str, Tensor]:
        return _flat({"sink_readout": sink_readout(model, clean),
                      "dominant": dominant_super_neuron(model, clean),
                      "sets": massive_channel_sets(model, clean)})

    def attention_view() -> dict[str, Tensor]:
        with torch.no_grad():
            _, cache = model.run_with_cache(clean)
        view = viz.attention(cache, clean[0], layer=1, model=model)
        return _flat({"patterns": view.patterns, "tokens": [len(t) for t in view.tokens]})

    def experiment() -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        flatten(gpt2_query_bias.run(model, model_name="compat", n=4, seq_len=16, top=2).data,
                "gpt2_query_bias", out)
        return out

    return {
        "forward (logits)": forward,
        "census": run_census,
        # one patch per forward: each starts at its own position, reading the prefix's K/V
        "activation_patch resid_pre by position (prefix reuse)": patch("resid_pre",
                                                                       batch_size=1),
        # the metric reads block 0: the recorded runs and the patched ones end after it
        "activation_patch resid_pre, sink at layer 0": patch("resid_pre", SinkScore(0, 0)),
        "activation_patch resid_mid, logit diff": patch("resid_mid", diff),
        "activation_patch attn_out / mlp_out": lambda: {
            **{f"attn.{k}": v for k, v in patch("attn_out")().items()},
            **{f"mlp.{k}": v for k, v in patch("mlp_out")().items()}},
        "activation_patch z per head": patch("z", diff),
        "activation_patch pattern": patch("pattern"),
        "activation_patch neurons, noise, resample": patch(
            parse_site("neuron", layers=(0,), units=tuple(range(12))), direction="noise",
            ablation="resample", reference=corrupted),
        "attribution_patch resid_pre, z": lambda: {
            **{f"resid.{k}": v for k, v in _patch(attribution_patch(
                model, clean, corrupted, "resid_pre", diff, prepend_bos=False)).items()},
            **{f"z.{k}": v for k, v in _patch(attribution_patch(
                model, clean, corrupted, "z", sink, prepend_bos=False)).items()}},
        "path_patch senders -> metric": lambda: _patch(path_patch(
            model, clean, corrupted, [*heads, "MLP0"], ["metric"], [sink, diff],
            prepend_bos=False)),
        "path_patch senders -> L1H0.q/k/v, frozen scales": lambda: _patch(path_patch(
            model, clean, corrupted, heads, ["L1H0.q", "L1H0.k", "L1H0.v"], diff,
            scales="frozen", prepend_bos=False)),
        "path_patch mean ablation": lambda: _patch(path_patch(
            model, clean, None, heads, ["metric"], sink, ablation="batch_mean",
            prepend_bos=False)),
        "interventions": interventions,
        "readout (sink_readout, dominant_super_neuron, massive_channel_sets)": readout,
        "viz.attention from a cache": attention_view,
        "discover (edge attribution)": lambda: _flat(discover(
            model, clean, sink, corrupted=corrupted, steps=2, verify=2).to_dict()),
        "experiment p0_edges": lambda: _flat(p0_edges.run(
            model, model_name="compat", n=2, seq_len=16, steps=2, verify=2, n_random=1).data),
        "experiment structural_origin": lambda: _flat(structural_origin.run(
            model, model_name="compat", n=2, seq_len=16, positions=(4,),
            doses=(0.0, 1.0)).data),
        **({"experiment gpt2_query_bias": experiment}
           if model.cfg.positional_embedding_type == "standard" else {}),
    }


def max_difference(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """The largest absolute difference over every number (NaN == NaN); a key or length on
    one side only counts as infinite."""
    if set(a) != set(b):
        return math.inf
    worst = 0.0
    for k in a:
        x, y = a[k], b[k]
        if x.shape != y.shape:
            return math.inf
        both_nan = torch.isnan(x) & torch.isnan(y)
        d = (x - y).abs().masked_fill(both_nan, 0.0)
        if torch.isnan(d).any():
            return math.inf
        if d.numel():
            worst = max(worst, float(d.max()))
    return worst


def compute(model: Any) -> dict[str, dict[str, Tensor] | str]:
    """Every entry point's numbers on ``model`` (or the error it raised, as text)."""
    results: dict[str, dict[str, Tensor] | str] = {}
    for name, thunk in entry_points(model).items():
        torch.manual_seed(0)
        start = time.perf_counter()
        try:
            results[name] = thunk()
        except Exception as exc:  # recorded so the table shows which entry point failed
            results[name] = f"{type(exc).__name__}: {exc}"
        if os.environ.get("MECHSINK_COMPAT_TIMES"):
            print(f"{name}: {time.perf_counter() - start:.2f} s", file=sys.stderr)
    return results
