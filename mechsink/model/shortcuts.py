"""The forward shortcuts the engine takes and :mod:`mechsink.model.probes` verifies per model.

- :func:`start_forward`: ``model(resid, start_at_layer=...)``, the blocks before it skipped;
- :func:`injected_forward`: the fallback where ``start_at_layer`` ignores the residual given
  (Bloom's bridge): a full forward whose residual entering the block is replaced by a hook;
- :func:`unembed`: logits from the last block's output, with whatever the model applies after
  its unembedding (:func:`output_logits_step`).

They live apart from :mod:`mechsink.model.forward` so that the probes (which test them) and
the runs (which consult the probes' verdicts) both import them, and neither imports the other
the wrong way: ``shortcuts <- probes <- kv <- forward``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.model.hooks import act_name, write_in_place
from mechsink.model.patches.growing_batch import masks_follow_batch
from mechsink.model.patches.skip_blocks import only_blocks_from

HookFn = Callable[..., Any]


def start_forward(
    model: Any, resid: Float[Tensor, "batch pos_in d_model"], start: int,
    hooks: Sequence[tuple[str, HookFn]] = (), reads_cache: Any = None, **kwargs: Any,
) -> Float[Tensor, "rows pos d_vocab"]:
    """``model(resid, start_at_layer=start)`` with ``hooks``, blocks before ``start`` skipped
    (the shortcut :func:`mechsink.model.capabilities` checks per model)."""
    with model.hooks(fwd_hooks=list(hooks)), only_blocks_from(model, start), \
            reads_cache if reads_cache is not None else nullcontext(), masks_follow_batch(model):
        return model(resid, start_at_layer=start, return_type="logits", **kwargs)


def injected_forward(
    model: Any, resid: Float[Tensor, "batch pos_in d_model"], start: int,
    hooks: Sequence[tuple[str, HookFn]] = (),
) -> Float[Tensor, "rows pos d_vocab"]:
    """A full forward whose residual entering block ``start`` is replaced by ``resid`` (the
    fallback where ``start_at_layer`` ignores the residual given, e.g. Bloom's bridge). The
    blocks before ``start`` run on placeholder tokens and their output is discarded."""
    tokens = torch.zeros(resid.shape[:2], dtype=torch.long, device=resid.device)

    def inject(act: Tensor, hook: Any) -> Tensor:
        return write_in_place(act, resid.to(act.dtype))

    injected = [(act_name("resid_pre", start), inject), *hooks]
    with model.hooks(fwd_hooks=injected), masks_follow_batch(model):
        return model(tokens, return_type="logits")


def output_logits_step(model: Any, logits: Float[Tensor, "*batch d_vocab"]
                       ) -> Float[Tensor, "*batch d_vocab"]:
    """What the model applies to its unembedding's output: the bridge adapter's own transform
    (Gemma 2's final soft-cap, Cohere's logit scale, Granite's divisor); on a HookedTransformer
    its ``output_logits_soft_cap``."""
    adapter = getattr(model, "adapter", None)
    transform = getattr(adapter, "apply_output_logits_transform", None)
    if transform is not None:
        return transform(logits)
    cap = float(getattr(model.cfg, "output_logits_soft_cap", -1.0) or -1.0)
    return cap * torch.tanh(logits / cap) if cap > 0 else logits


#: modules a TransformerLens bridge mounts between the final norm and the unembedding, in the
#: order the model applies them: a BERT-style prediction head (dense, activation, norm:
#: ModernBERT-decoder's ``lm_head``) and OPT's ``project_out`` (OPT-350m's smaller embedding
#: width). Other readout modules (DeepSeek-V4's ``hc_head``) are not applied: the unembedding
#: then differs from the model's logits, the probe finds it, and the engine reads the model's
#: own logits instead (:func:`mechsink.model.capabilities`).
READOUT_HEADS = ("prediction_head", "project_out")


def readout_heads(model: Any) -> list[Any]:
    """The modules of :data:`READOUT_HEADS` this model mounts, in order."""
    modules = getattr(model, "_modules", {})
    return [modules[name] for name in READOUT_HEADS if modules.get(name) is not None]


def unembed(
    model: Any, resid_final: Float[Tensor, "batch pos d_model"]
) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits from the last block's output (for a few positions): final norm, any readout head
    the model applies before its unembedding (:func:`readout_heads`), the unembedding, and
    whatever the model applies after it (:func:`output_logits_step`: soft-caps, logit scales).
    A model without a final norm (GPT-1) unembeds the last block's output directly."""
    x = model.ln_final(resid_final) if getattr(model, "ln_final", None) is not None \
        else resid_final
    for head in readout_heads(model):
        x = head(x)
    return output_logits_step(model, model.unembed(x))
