"""Weight-only int4 round-to-nearest and the super weight: what the loss pays when the linear
weights are quantized, with and without the super weight kept in full precision (Yu et al. 2024,
"The Super Weight in Large Language Models").

**Quantizer.** Every linear weight of the decoder (attention q/k/v/o, MLP gate/up/down; not the
embeddings nor the language-model head) is quantized along its input dimension, round to nearest,
asymmetric min-max with a zero point (the round-to-nearest baseline of Frantar et al. 2023,
"GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers"):
``scale = (max - min) / (2^bits - 1)``, ``zero = round(-min / scale)``,
``w_q = (clamp(round(w / scale) + zero, 0, 2^bits - 1) - zero) * scale``, the min and max taken

- *group-wise*: over each run of ``group_size`` consecutive input channels of an output row (the
  last group of a row shorter when ``group_size`` does not divide the input width), or
- *per channel*: over each whole output row (``group_size=None``).

``symmetric=True`` uses ``scale = max |w| / (2^(bits-1) - 1)`` and ``clamp(round(w / scale),
-qmax, qmax)`` instead. Entries *kept* stay in full precision and set no scale (their group's min
and max are taken over the other entries).

**The super weights** are the down-projection entries ``W_out[neuron, channel]`` that join the
super neurons to the massive channel at position 0: for every block that builds the channel,
the neurons of its complete super-neuron set
(:func:`mechsink.interventions.readout.massive_channel_sets`; a one-neuron set is Yu et al.'s
single super weight). The settings measured (:data:`SETTINGS`): full precision; int4 group-wise
and per channel, each with the super weights quantized like the rest and kept in full precision;
the super weights zeroed alone (the rest in full precision, Yu et al.'s ablation); the *top*
super weight zeroed alone (the one whose neuron contributes most to the channel's write, or the
largest in magnitude where no contribution is known: Yu et al.'s single weight); and the super
weights *kept alone*: the ``n_outliers`` largest-magnitude other linear weights zeroed and the
super weights kept (Yu et al.'s contrast: many large weights matter less than the one).

Every edit is made in place on the model's own parameters inside a context manager that puts
the original values back on exit, also after an exception.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from mechsink.errors import BadInputError
from mechsink.measure.cache import rounded
from mechsink.model.kinds import plain_module

BITS = 4
GROUP_SIZE = 128
N_OUTLIERS = 7000  # the other large weights zeroed in "super kept alone"
SETTINGS = ("fp", "int4_group", "int4_group_super_kept", "int4_channel",
            "int4_channel_super_kept", "super_zeroed", "top_super_zeroed", "super_kept_alone")


# --- the quantizer --------------------------------------------------------------------------


def check_quant_args(bits: int, group_size: int | None) -> None:
    """``bits`` an integer in 2..8, ``group_size`` None (per channel) or a positive integer."""
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise BadInputError(f"bits takes an integer from 2 to 8, got {bits!r}.")
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                   or group_size < 1):
        raise BadInputError(f"group_size takes a positive integer (or None: per channel), got "
                            f"{group_size!r}.")


def _rtn(w: Float[Tensor, "row group"], keep: Bool[Tensor, "row group"], bits: int,
         symmetric: bool) -> Float[Tensor, "row group"]:
    """One group per row quantized and dequantized; ``keep`` entries returned as they are."""
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        peak = w.abs().masked_fill(keep, 0.0).amax(1, keepdim=True)
        scale = peak / qmax
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.clamp(torch.round(w / safe), -qmax, qmax) * safe
    else:
        levels = 2 ** bits - 1
        hi = w.masked_fill(keep, -math.inf).amax(1, keepdim=True)
        lo = w.masked_fill(keep, math.inf).amin(1, keepdim=True)
        scale = (hi - lo) / levels
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        zero = torch.round(-lo / safe)
        q = (torch.clamp(torch.round(w / safe) + zero, 0, levels) - zero) * safe
    q = torch.where(scale > 0, q, w)  # a constant (or all-kept) group is exact as it is
    return torch.where(keep, w, q)


def quantize_rtn(
    w: Float[Tensor, "out inp"], bits: int = BITS, group_size: int | None = GROUP_SIZE, *,
    symmetric: bool = False, keep: Bool[Tensor, "out inp"] | None = None,
) -> Float[Tensor, "out inp"]:
    """``w`` (``[out, in]``, the ``nn.Linear`` layout) quantized and dequantized round to
    nearest per group of input channels of each row (module doc), in float32; entries in
    ``keep`` stay as they are and set no scale."""
    check_quant_args(bits, group_size)
    x = w.detach().float()
    k = torch.zeros_like(x, dtype=torch.bool) if keep is None else keep.to(x.device)
    size = x.shape[1] if group_size is None else group_size
    groups = zip(x.split(size, 1), k.split(size, 1), strict=True)
    parts = [_rtn(a, b, bits, symmetric) for a, b in groups]
    return torch.cat(parts, 1)


# --- the model's linear weights ---------------------------------------------------------------


def _in_dim(module: nn.Module) -> int:
    """The input dimension of a linear module's weight: 1 for ``nn.Linear``, 0 for GPT-2's
    ``Conv1D`` (``[in, out]``)."""
    return 0 if type(module).__name__ == "Conv1D" else 1


def linear_weights(model: Any) -> dict[str, nn.Module]:
    """The decoder's linear modules by their transformers name: every ``nn.Linear`` (and GPT-2
    ``Conv1D``) but the language-model head, each once."""
    from mechsink.model.kinds import hf_model_of

    hf = hf_model_of(model) if hasattr(model, "original_model") else model
    head = (plain_module(hf.get_output_embeddings()) if hasattr(hf, "get_output_embeddings")
            else None)
    out: dict[str, nn.Module] = {}
    seen: set[int] = set()
    for name, module in hf.named_modules():
        if not (isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D"):
            continue
        if module is head or id(module) in seen or getattr(module, "weight", None) is None:
            continue
        seen.add(id(module))
        out[name.replace("._original_component", "")] = module
    if not out:
        raise BadInputError("this model has no linear weights to quantize.")
    return out


@dataclass(frozen=True)
class SuperWeight:
    """One super weight: ``W_out[neuron, channel]`` of block ``layer``'s down projection
    (``module``, its transformers name), its value and, where known, its neuron's mean
    contribution to the channel's write at position 0 (the complete set's)."""

    layer: int
    neuron: int
    channel: int
    module: str
    value: float
    contribution: float | None = None

    def index(self, module: nn.Module) -> tuple[int, int]:
        """The entry in ``module.weight``."""
        return (self.neuron, self.channel) if _in_dim(module) == 0 else (self.channel, self.neuron)

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "neuron": self.neuron, "channel": self.channel,
                "module": self.module, "value": rounded(self.value),
                "contribution": rounded(self.contribution)}


def down_projection_name(model: Any, layer: int) -> str:
    """The transformers name of block ``layer``'s down projection among :func:`linear_weights`."""
    target = plain_module(getattr(model.blocks[layer].mlp, "out", None))
    for name, module in linear_weights(model).items():
        if module is target:
            return name
    raise BadInputError(f"block {layer}'s MLP has no single down projection (a mixture of "
                        "experts?): its super weights cannot be named.")


def super_weights_of(model: Any, sets: dict[int, Sequence[int]], channel: int,
                     contributions: dict[tuple[int, int], float] | None = None,
                     ) -> list[SuperWeight]:
    """The super weights ``W_out[n, channel]`` of each block's neurons in ``sets``, with the
    neurons' ``contributions`` by ``(layer, neuron)`` where given."""
    mods = linear_weights(model)
    out = []
    for layer, neurons in sorted(sets.items()):
        name = down_projection_name(model, layer)
        mod = mods[name]
        for n in neurons:
            sw = SuperWeight(layer, int(n), int(channel), name, 0.0)
            out.append(SuperWeight(layer, int(n), int(channel), name,
                                   float(mod.weight.detach()[sw.index(mod)]),
                                   (contributions or {}).get((layer, int(n)))))
    return out


def find_super_weights(model: Any, tokens: Int[Tensor, "batch pos"]) -> list[SuperWeight]:
    """The super weights of the module doc: the complete super-neuron sets of the blocks that
    build the massive channel at position 0 on ``tokens``."""
    from mechsink.interventions.readout import massive_channel_sets

    found = massive_channel_sets(model, tokens)
    sets = {lay: found.sets[lay].units for lay in found.builders}
    contrib = {(lay, n): c for lay in found.builders for n, c in found.sets[lay].neurons}
    return super_weights_of(model, sets, found.channel, contrib)


def top_super_weight(weights: Sequence[SuperWeight]) -> SuperWeight:
    """The super weight whose neuron contributes most (in magnitude) to the channel's write;
    by ``|value|`` where a contribution is missing."""
    if not weights:
        raise BadInputError("no super weights: there is no top one to zero.")
    if all(w.contribution is not None for w in weights):
        return max(weights, key=lambda w: abs(w.contribution or 0.0))
    return max(weights, key=lambda w: abs(w.value))


# --- reversible edits -------------------------------------------------------------------------


@contextmanager
def restored(modules: Sequence[nn.Module]) -> Iterator[None]:
    """The weights of ``modules`` put back as they were on exit, also after an exception."""
    saved = [(m.weight, m.weight.detach().clone()) for m in modules]
    try:
        yield
    finally:
        with torch.no_grad():
            for param, value in saved:
                param.copy_(value)


def _keep_masks(model: Any, keep: Sequence[SuperWeight]) -> dict[str, Tensor]:
    mods = linear_weights(model)
    masks: dict[str, Tensor] = {}
    for sw in keep:
        mod = mods[sw.module]
        mask = masks.setdefault(sw.module, torch.zeros_like(mod.weight, dtype=torch.bool))
        mask[sw.index(mod)] = True
    return masks


@contextmanager
def quantized_weights(
    model: Any, bits: int = BITS, group_size: int | None = GROUP_SIZE, *,
    symmetric: bool = False, keep: Sequence[SuperWeight] = (),
) -> Iterator[dict[str, nn.Module]]:
    """Inside: every linear weight of :func:`linear_weights` replaced by its round-to-nearest
    quantization (:func:`quantize_rtn`), the entries of ``keep`` in full precision; the
    original weights restored on exit. Yields the modules quantized."""
    check_quant_args(bits, group_size)
    mods = linear_weights(model)
    masks = _keep_masks(model, keep)
    with restored(list(mods.values())), torch.no_grad():
        for name, mod in mods.items():
            w = mod.weight
            t = _in_dim(mod) == 0  # quantize along the input dimension: rows are outputs
            mask = masks.get(name)
            q = quantize_rtn(w.T if t else w, bits, group_size, symmetric=symmetric,
                             keep=None if mask is None else (mask.T if t else mask))
            w.copy_((q.T if t else q).to(w.dtype))
        yield mods


@contextmanager
def zeroed_weights(model: Any, weights: Sequence[SuperWeight]) -> Iterator[None]:
    """Inside: the entries ``weights`` set to 0 (the rest untouched); restored on exit."""
    mods = linear_weights(model)
    touched = list({id(mods[w.module]): mods[w.module] for w in weights}.values())
    with restored(touched), torch.no_grad():
        for sw in weights:
            mod = mods[sw.module]
            mod.weight[sw.index(mod)] = 0.0
        yield


@contextmanager
def outliers_zeroed(model: Any, n: int, spare: Sequence[SuperWeight] = ()) -> Iterator[int]:
    """Inside: the ``n`` largest-magnitude entries over every linear weight zeroed, the entries
    of ``spare`` excepted (Yu et al.'s "keep the super weight alone"); restored on exit. Yields
    the number zeroed."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise BadInputError(f"n_outliers takes an integer >= 0, got {n!r}.")
    mods = linear_weights(model)
    masks = _keep_masks(model, spare)
    mags, where = [], []
    for i, (name, mod) in enumerate(mods.items()):
        a = mod.weight.detach().abs().float().flatten()
        if name in masks:
            a = a.masked_fill(masks[name].flatten(), -1.0)
        top = a.topk(min(n, a.numel()))
        mags.append(top.values)
        where.append(torch.stack([torch.full_like(top.indices, i), top.indices], 1))
    mag, loc = torch.cat(mags), torch.cat(where)
    top = mag.topk(min(n, len(mag)))
    chosen = loc[top.indices[top.values >= 0]]  # never a spared entry (set to -1)
    modules = list(mods.values())
    with restored(modules), torch.no_grad():
        for i, flat in chosen.tolist():
            w = modules[i].weight
            w.view(-1)[flat] = 0.0
        yield int(len(chosen))


# --- the loss under each setting --------------------------------------------------------------


@torch.no_grad()
def sequence_losses(model: Any, tokens: Int[Tensor, "batch pos"], batch_size: int = 8
                    ) -> Float[Tensor, " batch"]:
    """Mean next-token cross-entropy per sequence under the model as it is now."""
    from mechsink.measure.loss import next_token_loss

    out = []
    for i in range(0, tokens.shape[0], batch_size):
        chunk = tokens[i:i + batch_size]
        out.append(next_token_loss(chunk, model(chunk)).double())
    return torch.cat(out)


@dataclass(frozen=True)
class WeightQuantizationResult:
    """Per setting (:data:`SETTINGS`) the per-sequence loss, and what was quantized and kept."""

    model: str
    bits: int
    group_size: int
    symmetric: bool
    n_tokens: tuple[int, int]  # (sequences, tokens each)
    losses: dict[str, Float[Tensor, " batch"]]
    super_weights: list[SuperWeight]
    n_linear: int
    n_outliers: int
    notes: dict[str, Any] = field(default_factory=dict)

    def loss(self, setting: str) -> float:
        return float(self.losses[setting].mean())

    def to_dict(self) -> dict[str, Any]:
        from mechsink.interventions.stats import mean_interval

        fp = self.losses["fp"]
        rows = {}
        for name, values in self.losses.items():
            row = {"loss": rounded(float(values.mean()), 5),
                   "perplexity": rounded(math.exp(float(values.mean())), 5),
                   "loss_interval": mean_interval(values).to_dict()}
            if name != "fp":
                row["delta_loss"] = rounded(float((values - fp).mean()), 5)
                row["delta_interval"] = mean_interval(values - fp).to_dict()
            rows[name] = row
        return {"schema": "mechsink-weight-quantization/1", "model": self.model,
                "method": f"weight-only int{self.bits} round to nearest, "
                          f"{'symmetric' if self.symmetric else 'asymmetric min-max'}, along "
                          f"the input dimension: group-wise (groups of {self.group_size} input "
                          "channels per output row) and per channel (one group per output row), "
                          f"on the {self.n_linear} linear weights of the decoder (not the "
                          "embeddings or the LM head); loss: mean next-token cross-entropy over "
                          "the natural-text prompts, intervals over prompts",
                "prompts": {"n": self.n_tokens[0], "seq_len": self.n_tokens[1]},
                "super_weights": [s.to_dict() for s in self.super_weights],
                "top_super_weight": top_super_weight(self.super_weights).to_dict()
                if self.super_weights else None,
                "n_outliers_zeroed": self.n_outliers, "settings": rows, **self.notes}


def weight_quantization_loss(
    model: Any, tokens: Int[Tensor, "batch pos"], *, bits: int = BITS,
    group_size: int = GROUP_SIZE, symmetric: bool = False,
    super_weights: Sequence[SuperWeight] | None = None, n_outliers: int = N_OUTLIERS,
    batch_size: int = 8, model_name: str | None = None,
) -> WeightQuantizationResult:
    """The loss on ``tokens`` under every setting of :data:`SETTINGS` (module doc);
    ``super_weights`` None: found on ``tokens`` (:func:`find_super_weights`). The model's
    weights are as they were on return."""
    check_quant_args(bits, group_size)
    if group_size is None:
        raise BadInputError("group_size takes a positive integer: per channel is measured too.")
    if isinstance(n_outliers, bool) or not isinstance(n_outliers, int) or n_outliers < 0:
        raise BadInputError(f"n_outliers takes an integer >= 0, got {n_outliers!r}.")
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise BadInputError(f"tokens takes [batch, pos] with pos >= 2, got {tuple(tokens.shape)}.")
    n_linear = len(linear_weights(model))
    sw = list(find_super_weights(model, tokens) if super_weights is None else super_weights)

    def run() -> Tensor:
        return sequence_losses(model, tokens, batch_size)

    losses = {"fp": run()}
    for tag, size in (("group", group_size), ("channel", None)):
        with quantized_weights(model, bits, size, symmetric=symmetric):
            losses[f"int{bits}_{tag}"] = run()
        with quantized_weights(model, bits, size, symmetric=symmetric, keep=sw):
            losses[f"int{bits}_{tag}_super_kept"] = run()
    with zeroed_weights(model, sw):
        losses["super_zeroed"] = run()
    if sw:
        with zeroed_weights(model, [top_super_weight(sw)]):
            losses["top_super_zeroed"] = run()
    with outliers_zeroed(model, n_outliers, spare=sw) as zeroed:
        losses["super_kept_alone"] = run()
    return WeightQuantizationResult(
        model_name or str(getattr(model.cfg, "model_name", "model")), bits, group_size,
        symmetric, (int(tokens.shape[0]), int(tokens.shape[1])), losses, sw, n_linear, zeroed)


def weight_quantization(
    model: Any, *, n: int = 16, seq_len: int = 128, seed: int = 0, bos: bool | None = None,
    bits: int = BITS, group_size: int = GROUP_SIZE, symmetric: bool = False,
    n_outliers: int = N_OUTLIERS, batch_size: int = 8, model_name: str | None = None,
) -> WeightQuantizationResult:
    """:func:`weight_quantization_loss` on ``n`` natural-text prompts of ``seq_len`` tokens
    (the shipped text, :func:`mechsink.make_prompts`), starting with the BOS token as ``bos``
    (None: where the model has one); the super weights are found on the same prompts."""
    from mechsink.inputs.prompts import make_prompts
    from mechsink.model.tokens import use_bos

    check_quant_args(bits, group_size)
    variant = "bos" if use_bos(model, bos) else "nobos"
    prompts = make_prompts(model, "natural", variant, n=n, seq_len=seq_len, seed=seed)
    result = weight_quantization_loss(
        model, prompts.tokens, bits=bits, group_size=group_size, symmetric=symmetric,
        n_outliers=n_outliers, batch_size=batch_size, model_name=model_name)
    notes = {"prompts_suite": "natural", "first_token": variant, "seed": seed}
    return WeightQuantizationResult(**{**result.__dict__, "notes": notes})
