"""Turn the model a researcher holds into one every mechsink function takes, and back.

Everything else in mechsink talks to a model through the surface TransformerLens models share
(``run_with_cache``, ``run_with_hooks``, ``hooks()``, ``cfg``, ``start_at_layer`` /
``stop_at_layer`` and the standard hook names). :func:`wrap` turns a transformers model into a
``TransformerBridge`` and passes a bridge or a ``HookedTransformer`` through;
:func:`plain_hf_copy` gives the plain transformers model back (for saving).

Weight processing: by default the bridge keeps the raw Hugging Face weights
(``enable_compatibility_mode(no_processing=True)``), so residual norms and massive activations
equal the original model's. ``fold_weights=True`` applies HookedTransformer's load-time
processing instead (fold LayerNorm, centre writing weights and unembedding): logits are
unchanged, but residual-stream values are not, so the massive-activation figures change.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from mechsink.errors import BadInputError
from mechsink.model.finite import check_finite_weights
from mechsink.model.kinds import hf_model_of, is_bridge, is_hf_causal_lm, is_hooked_transformer
from mechsink.model.patches.alibi_qkv_fork import install_alibi_qkv_fork
from mechsink.model.patches.attention_hooks import install_attention_hooks
from mechsink.model.patches.bloom_block_inputs import install_bloom_block_inputs
from mechsink.model.patches.list_outputs import install_list_output_hooks
from mechsink.model.patches.offline import offline
from mechsink.model.patches.rotary_dtype import install_rotary_dtype
from mechsink.model.patches.tokenizer_lookup import no_tokenizer_lookup
from mechsink.model.patches.variant_patterns import use_variant_patterns
from mechsink.model.tokens import bos_token_id
from mechsink.model.variants import apply_variants, variants_of
from mechsink.model.versions import old_bridge_error, tl_major
from mechsink.model.weights import n_kv_heads

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

ACCEPTED = ("a TransformerLens TransformerBridge, a TransformerLens HookedTransformer, or a "
            "transformers causal language model (a PreTrainedModel with a language-model head)")


def wrap(model: Any, tokenizer: Any = None, *, name: str | None = None,
         fold_weights: bool = False) -> Any:
    """Any model a researcher holds, ready for every mechsink function.

    - a transformers causal LM in memory: wrapped in a TransformerBridge (raw weights, eager
      attention; see :func:`wrap_hf`), with ``tokenizer`` (without one, pass token ids, not
      text). No network is used: the tokenizer is never looked up by name.
    - a TransformerLens ``HookedTransformer`` or ``TransformerBridge``: returned as it is (a
      ``tokenizer`` is attached only when the model has none; a bridge's attention hooks are
      made to fire inside its computation, :mod:`mechsink.model.patches.attention_hooks`, and
      GPT-1's block outputs hooked, :mod:`mechsink.model.patches.list_outputs`).

    Anything else is a ``TypeError`` that says what is accepted. ``name`` labels the model in
    results (default: the transformers config's ``name_or_path``, else the class name).
    """
    check_finite_weights(model)
    if is_bridge(model) or is_hooked_transformer(model):
        if tokenizer is not None and getattr(model, "tokenizer", None) is None:
            if is_hooked_transformer(model):
                model.set_tokenizer(tokenizer)
            else:
                model.tokenizer = tokenizer
        if is_bridge(model):
            install_attention_hooks(model)
            install_alibi_qkv_fork(model)
            install_bloom_block_inputs(model)
            install_list_output_hooks(model)
            install_rotary_dtype(model)
        return model
    if is_hf_causal_lm(model):
        label = name or getattr(getattr(model, "config", None), "name_or_path", None) or \
            type(model).__name__
        return wrap_hf(model, tokenizer, name=str(label), fold_weights=fold_weights)
    if isinstance(model, str):
        raise TypeError(f"mechsink.wrap takes a model object, not the string {model!r}: "
                        "load a named model with mechsink.load_model(name).")
    raise TypeError(f"mechsink.wrap cannot use a {type(model).__module__}."
                    f"{type(model).__name__}: it accepts {ACCEPTED}.")


def wrap_hf(
    hf_model: nn.Module, tokenizer: Any, *, name: str, fold_weights: bool = False
) -> TransformerBridge:
    """Wrap a loaded transformers causal LM in a TransformerBridge in compatibility mode.

    The model is switched to eager attention (so ``hook_pattern`` fires) and to eval mode.
    ``fold_weights=False`` keeps the raw weights (the default for sink work; see module doc).
    ``tokenizer=None`` gives a bridge without a tokenizer (token ids only); nothing is looked
    up by ``name``, and no network is used.
    """
    if tl_major() < 4:
        raise old_bridge_error()
    from transformer_lens.model_bridge import TransformerBridge

    hf_model.eval()
    config = getattr(hf_model, "config", None)
    if config is not None and not getattr(config, "architectures", None):
        # GGUF and from_config models carry no `architectures`; the bridge picks its adapter by it.
        config.architectures = [type(hf_model).__name__]
    no_lookup = no_tokenizer_lookup() if tokenizer is None else nullcontext()
    with warnings.catch_warnings(), offline(), no_lookup:
        warnings.simplefilter("ignore")
        previous = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)
        try:
            bridge = TransformerBridge.boot_transformers(
                name, hf_model=hf_model, tokenizer=tokenizer
            )
            try:
                bridge.enable_compatibility_mode(no_processing=not fold_weights,
                                                 disable_warnings=True)
            except (RuntimeError, NotImplementedError, ValueError) as exc:
                raise BadInputError(
                    f"{type(hf_model).__name__} is not supported by mechsink's wrap: "
                    "TransformerLens refuses its compatibility mode, which mechsink's hooks "
                    f"and engine need ({type(exc).__name__}: {_first_line(exc)}); it would work "
                    "once TransformerLens's adapter for it supports compatibility mode.") from exc
        finally:
            logging.getLogger().setLevel(previous)
    use_variant_patterns(bridge)
    install_attention_hooks(bridge)
    install_alibi_qkv_fork(bridge)
    install_bloom_block_inputs(bridge)
    install_list_output_hooks(bridge)
    install_rotary_dtype(bridge)
    bridge.eval()
    check_bridge_runs(bridge)
    return bridge


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:limit]


@torch.no_grad()
def check_bridge_runs(bridge: Any) -> None:
    """Raise a one-line :class:`BadInputError` when the bridge's forward fails on two tokens:
    a TransformerLens adapter written against another transformers version (CodeGen's reads
    an ``embed_positions`` its attention no longer has) would otherwise load fine and fail
    on the user's first forward with a traceback from inside TransformerLens. One forward of
    one sequence of two tokens."""
    arch = type(hf_model_of(bridge)).__name__
    vocab = int(bridge.cfg.d_vocab)
    device = getattr(bridge.cfg, "device", None)
    tokens = torch.tensor([[0, 1 % vocab]], device=device)
    try:
        bridge(tokens, return_type="logits")
    except BadInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure inside the bridge: say so in one line
        from importlib.metadata import version

        raise BadInputError(
            f"{arch} is not supported by mechsink's wrap: its TransformerLens "
            f"{version('transformer-lens')} bridge fails on a two-token forward "
            f"({type(exc).__name__}: {_first_line(exc)}), so nothing would run; it would work "
            f"with a TransformerLens release whose {arch} adapter matches the installed "
            f"transformers {version('transformers')}.") from exc


def architecture_summary(model: Any) -> dict[str, Any]:
    """A small JSON-able description of the architecture (what `mechsink models` prints)."""
    cfg = model.cfg
    try:
        module = hf_model_of(model)
    except BadInputError:  # a TransformerLens 2/3 HookedTransformer
        module = model
    arch = type(module).__name__
    if is_hooked_transformer(model):  # the architecture its weights came from, when known
        arch = str(getattr(cfg, "original_architecture", None) or arch)
    return {
        "architecture": arch,
        "n_layers": int(cfg.n_layers),
        "n_heads": int(cfg.n_heads),
        "n_kv_heads": n_kv_heads(model),
        "d_model": int(cfg.d_model),
        "d_head": int(cfg.d_head),
        "d_mlp": true_d_mlp(model),
        "n_ctx": int(cfg.n_ctx),
        "d_vocab": int(cfg.d_vocab),
        "positional_embedding": str(cfg.positional_embedding_type),
        "normalization": str(cfg.normalization_type),
        "activation": true_act_fn(model),
        "gated_mlp": bool(getattr(cfg, "gated_mlp", False)),
        "n_params": sum(p.numel() for p in module.parameters()),
        "dtype": str(true_dtype(model)).replace("torch.", ""),
        "bos_token_id": bos_token_id(model),
    }


# Config values TransformerLens 4.3's bridge reports wrongly, read from the transformers config
# instead: OPT's and XGLM's MLP width (``ffn_dim``; the bridge gives 4 x d_model), Bloom's and
# Falcon's activation (the bridge says relu; they use GELU), and cfg.dtype (float32 for a
# model loaded in bfloat16).
_D_MLP_FIELDS = ("ffn_dim", "ffn_hidden_size", "intermediate_size", "n_inner")
_ACT_FIELDS = ("hidden_act", "activation_function", "activation", "hidden_activation")
_ACT_BY_MODEL = {"bloom": "gelu_tanh"}  # BloomGelu: the tanh approximation, fixed in code


def _hf_config(model: Any) -> Any:
    try:
        return hf_model_of(model).config
    except BadInputError:
        return None


def true_d_mlp(model: Any) -> int | None:
    """The MLP hidden width, from the transformers config where it names one (the bridge's
    ``cfg.d_mlp`` is 4 x d_model for OPT and XGLM whatever their ``ffn_dim``)."""
    config = _hf_config(model)
    for name in _D_MLP_FIELDS if config is not None else ():
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    d_mlp = getattr(model.cfg, "d_mlp", None)
    return int(d_mlp) if d_mlp else None


def true_act_fn(model: Any) -> str:
    """The MLP activation, from the transformers config (Bloom's, fixed in its code, by
    model type); the bridge's ``cfg.act_fn`` otherwise."""
    config = _hf_config(model)
    if config is not None:
        if getattr(config, "model_type", None) in _ACT_BY_MODEL:
            return _ACT_BY_MODEL[config.model_type]
        for name in _ACT_FIELDS:
            value = getattr(config, name, None)
            if isinstance(value, str) and value:
                return value
    return str(model.cfg.act_fn)


def true_dtype(model: Any) -> torch.dtype:
    """The dtype the weights are held in (the bridge's ``cfg.dtype`` stays float32)."""
    try:
        module = hf_model_of(model)
    except BadInputError:
        module = model
    first = next(iter(module.parameters()), None)
    return first.dtype if first is not None else model.cfg.dtype


def plain_hf_copy(model: Any) -> nn.Module:
    """A fresh, unwrapped transformers model holding the bridge's current weights (a plain
    transformers model is returned as it is).

    The bridge rewires the wrapped model in place (its state dict then holds bridge aliases),
    so saving goes through this copy: every wrapped key, with ``._original_component`` removed,
    is matched to the plain model's own key names.
    """
    from transformers import AutoModelForCausalLM

    if not hasattr(model, "original_model"):  # already a plain transformers model
        return model
    wrapped = hf_model_of(model)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(wrapped.config, attn_implementation="eager")
        apply_variants(plain, variants_of(wrapped.config))
    wanted = set(plain.state_dict())
    weights: dict[str, Tensor] = {}
    for key, value in wrapped.state_dict().items():
        clean = key.replace("._original_component", "")
        if clean in wanted and clean not in weights:
            weights[clean] = value.detach().clone()
    missing = wanted - set(weights)
    tied = {k for k in missing if k.endswith("lm_head.weight")}
    if missing - tied:
        lost = sorted(missing - tied)[:5]
        raise RuntimeError(f"could not recover weights {lost} from the bridge")
    plain.load_state_dict(weights, strict=False, assign=True)
    if tied:
        plain.tie_weights()
    return plain.eval()
