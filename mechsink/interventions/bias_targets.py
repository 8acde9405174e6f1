"""Dose targets for the query-bias circuit: what a dose of the query bias, of its match with key
0 alone, of the layer-0 MLP at position 0 and of W_K's structure scales (0 is full removal, 1
the clean model), for :func:`mechsink.interventions.dose.dose_response`.

Removing ``b_Q`` changes every query, not only its match with the first key. The targeted
target :func:`query_bias_key0_set` removes only the term ``b_Q . k_0`` from each query's logit to
key 0 (rotated as the model rotates queries; every other logit untouched), so "the bias makes
key 0 win" is separated from "the bias changes every query". The circuit: a 2026 study of
GPT-2-style models (a learned query bias, the layer-0 MLP at position 0, structure in W_K);
sink score: Gu et al. (2024), "When Attention Sink Emerges in Language Models".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.interventions.edits import Intervention, ablate
from mechsink.interventions.targets import Target
from mechsink.measure.checks import check_layers
from mechsink.measure.logit_split import scored_qk_names
from mechsink.model import act_name, attention_scale, key_bias, n_kv_heads, query_bias


def _biases(model: Any, layers: Sequence[int]) -> dict[int, Tensor]:
    """``b_Q`` per query head of each layer; a model without a query bias is refused."""
    out = {}
    for layer in check_layers(model, layers):
        b_q = query_bias(model, layer)
        if b_q is None or not bool(b_q.detach().abs().max() > 0):
            raise BadInputError(
                f"layer {layer} has no query bias (its query projection is bias-free), so "
                "there is nothing to dose; the query-bias circuit needs a model with b_Q "
                "(GPT-2, Qwen2).")
        out[layer] = b_q.detach().float()
    return out


def query_bias_set(model: Any, layers: Sequence[int]) -> Target:
    """Scale ``b_Q`` of each of ``layers`` by the factor (``q - (1 - f) b_Q`` before any
    rotation): every query of those layers changes."""
    biases = _biases(model, layers)

    def edits(f: float) -> list[Intervention]:
        out = []
        for layer, b_q in biases.items():
            def fn(q: Tensor, hook: Any, b_q: Tensor = b_q) -> Tensor:
                return q - (1.0 - f) * b_q.to(q.dtype)

            out.append(Intervention(act_name("attn.hook_q", layer), fn,
                                    f"layer {layer}: query bias x{f}"))
        return out

    lays = tuple(biases)
    return Target(f"query bias b_Q of layers {list(lays)} (every query)", edits, lays)


@torch.no_grad()
def rotated_query_bias(
    model: Any, layer: int, seq_len: int,
) -> Float[Tensor, "pos head d_head"]:
    """``b_Q`` as it reaches the dot product at each query position (``R_i b_Q`` under rotary
    positions; ``b_Q`` itself otherwise), read off the model by running its queries set to
    ``b_Q``. The map from ``hook_q`` to the scored query must be linear (no query norm):
    checked by also running ``2 b_Q``."""
    b_q = _biases(model, [layer])[layer]
    q_name = act_name("attn.hook_q", layer)
    read_q, _ = scored_qk_names(model, layer)
    if read_q == q_name:
        return b_q[None].expand(seq_len, -1, -1).clone()
    seen: dict[str, Tensor] = {}

    def plant(q: Tensor, hook: Any) -> Tensor:
        out = q.clone()
        out[0] = b_q.to(q.dtype)
        out[1] = 2.0 * b_q.to(q.dtype)
        return out

    def record(q: Tensor, hook: Any) -> None:
        seen["q"] = q.detach().double()

    bos = int(model.tokenizer.bos_token_id if model.tokenizer.bos_token_id is not None else 0)
    tokens = torch.full((2, seq_len), bos, dtype=torch.long)
    model.run_with_hooks(tokens, fwd_hooks=[(q_name, plant), (read_q, record)],
                         stop_at_layer=layer + 1)
    once, twice = seen["q"][0], seen["q"][1]
    if float((twice - 2 * once).abs().max()) > 1e-4 * max(1.0, float(once.abs().max())):
        raise BadInputError(
            f"layer {layer}'s queries are not linear in b_Q between hook_q and the dot product "
            "(a query norm?): the targeted removal of b_Q . k_0 is not defined for this model.")
    return once.float()


def query_bias_key0_set(model: Any, layers: Sequence[int], seq_len: int) -> Target:
    """Scale only ``b_Q . k_0`` in every query's logit to key 0 of each of ``layers`` (for
    inputs of ``seq_len`` tokens): ``s_i0 - (1 - f) (R_i b_Q) . k_0 / scale``. Every other
    logit, and every query, is untouched; ``k_0`` is the key as the model scores it (rotated,
    with its bias; one KV head shared by a group of query heads)."""
    biases = _biases(model, layers)
    if getattr(model.cfg, "attn_scores_soft_cap", -1.0) not in (None, -1.0, 0.0):
        raise BadInputError("this model soft-caps its attention logits; the targeted "
                            "removal of b_Q . k_0 edits the logits before the cap and is not "
                            "defined for it.")
    group = int(model.cfg.n_heads) // n_kv_heads(model)
    rotated = {lay: rotated_query_bias(model, lay, seq_len) for lay in biases}
    scale = {lay: attention_scale(model, lay) for lay in biases}

    def edits(f: float) -> list[Intervention]:
        out = []
        for layer in biases:
            _, read_k = scored_qk_names(model, layer)
            key0: dict[str, Tensor] = {}

            def take_key(k: Tensor, hook: Any, key0: dict[str, Tensor] = key0) -> None:
                key0["k"] = k[:, 0].detach()  # [batch, kv_head, d_head]

            def edit_scores(s: Tensor, hook: Any, layer: int = layer,
                            key0: dict[str, Tensor] = key0) -> Tensor:
                n_pos = s.shape[-1]
                if n_pos > seq_len:
                    raise BadInputError(f"the targeted b_Q . k_0 edit was built for {seq_len} "
                                        f"tokens; this input has {n_pos}.")
                rq = rotated[layer][:n_pos].to(s.dtype)  # [pos, head, d_head]
                k0 = key0["k"].to(s.dtype).repeat_interleave(group, dim=1)  # [batch, head, d]
                term = torch.einsum("phe,bhe->bhp", rq, k0) / scale[layer]
                new = s.clone()
                new[..., 0] = s[..., 0] - (1.0 - f) * term
                return new

            out += [Intervention(read_k, take_key, f"layer {layer}: read k_0"),
                    Intervention(act_name("attn.hook_attn_scores", layer), edit_scores,
                                 f"layer {layer}: b_Q . k_0 x{f} in the logits to key 0")]
        return out

    lays = tuple(biases)
    return Target(f"b_Q . k_0 in the logits to key 0 of layers {list(lays)} (only that term)",
                  edits, lays)


def mlp0_at_first_token(model: Any) -> Target:
    """Scale the layer-0 MLP's output at position 0 (what it writes into the first token)."""
    def edits(f: float) -> list[Intervention]:
        return [ablate(model, "hook_mlp_out", 0, mode="scale", scale=f, positions=[0])]

    edits(1.0)
    return Target("layer-0 MLP output at position 0", edits, (0,))


def key_structure_set(model: Any, layers: Sequence[int], seed: int = 0) -> Target:
    """Interpolate each layer's keys between ``W_K`` (factor 1) and ``W_K R`` (factor 0), ``R``
    a random orthogonal matrix per KV head (seed): ``k - b_K`` becomes ``(k - b_K)(f I + (1-f)
    R)``, keys keep their bias; at 0 the alignment of ``W_K`` with ``W_Q`` is gone."""
    lays = check_layers(model, layers)
    b_all = key_bias(model)
    d_head = int(model.cfg.d_head)
    gen = torch.Generator().manual_seed(seed)
    rots = {lay: torch.linalg.qr(torch.randn(n_kv_heads(model), d_head, d_head,
                                             generator=gen))[0] for lay in lays}

    def edits(f: float) -> list[Intervention]:
        out = []
        for lay in lays:
            mix = f * torch.eye(d_head) + (1.0 - f) * rots[lay]
            bias = None if b_all is None else b_all[lay].detach()

            def fn(k: Tensor, hook: Any, mix: Tensor = mix, bias: Tensor | None = bias) -> Tensor:
                b = 0.0 if bias is None else bias.to(k.dtype)
                return torch.einsum("bphe,hef->bphf", k - b, mix.to(k.dtype)) + b

            out.append(Intervention(act_name("attn.hook_k", lay), fn,
                                    f"layer {lay}: W_K structure x{f} (seed {seed})"))
        return out

    return Target(f"W_K structure of layers {list(lays)} (random rotation, seed {seed})",
                  edits, tuple(lays))
