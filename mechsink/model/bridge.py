"""The one door to TransformerLens: wrap a transformers model, tokenise, and read its config.

Everything else in mechsink talks to a model through the surface TransformerLens models share
(``run_with_cache``, ``run_with_hooks``, ``hooks()``, ``cfg``, ``start_at_layer`` /
``stop_at_layer`` and the standard hook names). Anything that depends on TransformerLens's
version or internals lives here, and so does everything that differs between the two kinds of
TransformerLens model mechsink accepts: a ``TransformerBridge`` (TransformerLens 3.9 and 4.x,
what :func:`mechsink.load_model` returns) and a ``HookedTransformer`` (TransformerLens 2.x and
3.x). :func:`wrap` turns a transformers model into a bridge and passes either kind through.

Weight processing: by default the bridge keeps the raw Hugging Face weights
(``enable_compatibility_mode(no_processing=True)``), so residual norms and massive activations
equal the original model's. ``fold_weights=True`` applies HookedTransformer's load-time
processing instead (fold LayerNorm, centre writing weights and unembedding): logits are
unchanged, but residual-stream values are not, so the massive-activation figures change.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from mechsink.errors import BadInputError, MissingDependencyError

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


def __getattr__(name: str) -> Any:
    """Import TransformerLens lazily (it takes seconds): ``mechsink.model.TransformerBridge``."""
    if name == "TransformerBridge":
        from transformer_lens.model_bridge import TransformerBridge

        return TransformerBridge
    raise AttributeError(f"module 'mechsink.model.bridge' has no attribute {name!r}")

__all__ = [
    "TransformerBridge",
    "act_name",
    "wrap",
    "is_hooked_transformer",
    "is_bridge",
    "wrap_hf",
    "hf_model_of",
    "tokenizer_of",
    "bos_token_id",
    "to_tokens",
    "token_strings",
    "check_tokens",
    "n_kv_heads",
    "context_length",
    "check_seq_len",
    "architecture_summary",
    "plain_hf_copy",
    "hook_names",
    "run_from_layer",
    "unembed",
    "has_hook",
    "down_projection",
    "head_output_weights",
    "write_in_place",
    "query_bias",
    "key_weights",
    "key_bias",
    "norm_params",
    "PrefixKV",
    "supports_prefix_reuse",
    "run_with_kv",
]


def _class_names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def is_hooked_transformer(model: Any) -> bool:
    """True for a TransformerLens ``HookedTransformer`` (2.x/3.x), checked without importing
    TransformerLens."""
    return "HookedTransformer" in _class_names(model)


def is_bridge(model: Any) -> bool:
    """True for a TransformerLens ``TransformerBridge``."""
    return "TransformerBridge" in _class_names(model)


ACCEPTED = ("a TransformerLens TransformerBridge, a TransformerLens HookedTransformer, or a "
            "transformers causal language model (a PreTrainedModel with a language-model head)")


def _is_hf_causal_lm(model: Any) -> bool:
    names = _class_names(model)
    return "PreTrainedModel" in names and any(
        n.endswith(("ForCausalLM", "LMHeadModel")) for n in names)


def wrap(model: Any, tokenizer: Any = None, *, name: str | None = None,
         fold_weights: bool = False) -> Any:
    """Any model a researcher holds, ready for every mechsink function.

    - a transformers causal LM in memory: wrapped in a TransformerBridge (raw weights, eager
      attention; see :func:`wrap_hf`), with ``tokenizer`` (without one, pass token ids, not
      text). No network is used: the tokenizer is never looked up by name.
    - a TransformerLens ``HookedTransformer`` or ``TransformerBridge``: returned as it is (a
      ``tokenizer`` is attached only when the model has none).

    Anything else is a ``TypeError`` that says what is accepted. ``name`` labels the model in
    results (default: the transformers config's ``name_or_path``, else the class name).
    """
    if is_bridge(model) or is_hooked_transformer(model):
        if tokenizer is not None and getattr(model, "tokenizer", None) is None:
            if is_hooked_transformer(model):
                model.set_tokenizer(tokenizer)
            else:
                model.tokenizer = tokenizer
        return model
    if _is_hf_causal_lm(model):
        label = name or getattr(getattr(model, "config", None), "name_or_path", None) or \
            type(model).__name__
        return wrap_hf(model, tokenizer, name=str(label), fold_weights=fold_weights)
    if isinstance(model, str):
        raise TypeError(f"mechsink.wrap takes a model object, not the string {model!r}: "
                        "load a named model with mechsink.load_model(name).")
    raise TypeError(f"mechsink.wrap cannot use a {type(model).__module__}."
                    f"{type(model).__name__}: it accepts {ACCEPTED}.")


@contextmanager
def _offline() -> Iterator[None]:
    """No model-hub access inside (the hub libraries' offline switch, restored on exit):
    wrapping a model that is already in memory must never reach for the network."""
    import os

    modules = []
    try:
        import huggingface_hub.constants as hub_constants

        modules.append(hub_constants)
    except ImportError:  # pragma: no cover - transformers always brings it
        pass
    saved_env = os.environ.get("HF_HUB_OFFLINE")
    saved = [(m, getattr(m, "HF_HUB_OFFLINE", None)) for m in modules]
    os.environ["HF_HUB_OFFLINE"] = "1"
    for m in modules:
        m.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        for m, value in saved:
            m.HF_HUB_OFFLINE = value
        if saved_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved_env


@contextmanager
def _no_tokenizer_lookup() -> Iterator[None]:
    """Stop TransformerBridge.boot_transformers from loading a tokenizer by the model's name
    (a hub lookup) when none was given: the bridge is built without one."""
    try:
        from transformer_lens.model_bridge.sources.transformers import source
    except ImportError:  # other TransformerLens layouts: _offline() still keeps it local
        yield
        return
    original = getattr(source, "skip_tokenizer_for_modality", None)
    if original is None:
        yield
        return
    source.skip_tokenizer_for_modality = lambda cfg: True
    try:
        yield
    finally:
        source.skip_tokenizer_for_modality = original


def wrap_hf(
    hf_model: nn.Module, tokenizer: Any, *, name: str, fold_weights: bool = False
) -> TransformerBridge:
    """Wrap a loaded transformers causal LM in a TransformerBridge in compatibility mode.

    The model is switched to eager attention (so ``hook_pattern`` fires) and to eval mode.
    ``fold_weights=False`` keeps the raw weights (the default for sink work; see module doc).
    ``tokenizer=None`` gives a bridge without a tokenizer (token ids only); nothing is looked
    up by ``name``, and no network is used.
    """
    if _tl_major() < 4:
        raise _old_bridge_error()
    from transformer_lens.model_bridge import TransformerBridge

    hf_model.eval()
    config = getattr(hf_model, "config", None)
    if config is not None and not getattr(config, "architectures", None):
        # GGUF and from_config models carry no `architectures`; the bridge picks its adapter by it.
        config.architectures = [type(hf_model).__name__]
    no_lookup = _no_tokenizer_lookup() if tokenizer is None else nullcontext()
    with warnings.catch_warnings(), _offline(), no_lookup:
        warnings.simplefilter("ignore")
        previous = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)
        try:
            bridge = TransformerBridge.boot_transformers(
                name, hf_model=hf_model, tokenizer=tokenizer
            )
            bridge.enable_compatibility_mode(no_processing=not fold_weights, disable_warnings=True)
        finally:
            logging.getLogger().setLevel(previous)
    _use_variant_patterns(bridge)
    bridge.eval()
    return bridge


def _use_variant_patterns(bridge: Any) -> None:
    """Attention variants (mechsink.model.variants) replace the softmax over keys: the bridge's own
    softmax, whose output hook_pattern sees and the values are weighted by, becomes theirs."""
    from mechsink.model.variants import variant_pattern_fn

    for module in bridge.modules():
        if not hasattr(module, "_masked_softmax"):
            continue
        fn = variant_pattern_fn(getattr(module, "original_component", None))
        if fn is not None:
            module._masked_softmax = fn


def hf_model_of(model: Any) -> nn.Module:
    """The plain transformers model behind a bridge (for parity checks and saving)."""
    original = model.__dict__.get("original_model") if hasattr(model, "__dict__") else None
    if original is None:
        original = getattr(model, "original_model", None)
    if original is None:
        raise BadInputError(
            f"{type(model).__name__} does not wrap a transformers model; "
            "load it with mechsink.load_model(...) to get a TransformerBridge."
        )
    return original


def tokenizer_of(model: Any) -> Any:
    """The model's tokenizer; raises a clear error when the model has none."""
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        raise BadInputError("this model has no tokenizer: pass token ids instead of text.")
    return tok


def bos_token_id(model: Any) -> int | None:
    """The id mechsink prepends when ``prepend_bos=True`` (None if the tokenizer has no BOS)."""
    tok = getattr(model, "tokenizer", None)
    return None if tok is None else tok.bos_token_id


def to_tokens(
    model: Any,
    text: str | Sequence[str],
    *,
    prepend_bos: bool,
    seq_len: int | None = None,
) -> Int[Tensor, "batch pos"]:
    """Tokenise text with an explicit BOS choice (the tokenizer's own default is ignored).

    Each text is encoded without special tokens, then the tokenizer's BOS token is put in
    front when ``prepend_bos``. With ``seq_len`` every row is cut to that length (a text that
    is too short is an error); without it, all texts must give the same number of tokens.
    """
    texts = [text] if isinstance(text, str) else list(text)
    if not texts:
        raise BadInputError("no text given: pass a string or a non-empty list of strings.")
    tok = tokenizer_of(model)
    bos = tok.bos_token_id
    if prepend_bos and bos is None:
        raise BadInputError(
            "prepend_bos=True but this tokenizer has no BOS token; use prepend_bos=False."
        )
    rows = []
    for t in texts:
        ids = tok(t, add_special_tokens=False)["input_ids"]
        if prepend_bos:
            ids = [bos, *ids]
        rows.append(ids)
    if seq_len is not None:
        short = [i for i, r in enumerate(rows) if len(r) < seq_len]
        if short:
            raise BadInputError(
                f"text {short[0]} gives {len(rows[short[0]])} tokens, fewer than seq_len={seq_len}:"
                " give longer texts or a smaller seq_len."
            )
        rows = [r[:seq_len] for r in rows]
    lengths = {len(r) for r in rows}
    if len(lengths) != 1:
        raise BadInputError(
            f"texts tokenise to different lengths {sorted(lengths)}: pass seq_len=N to cut them "
            "to a common length."
        )
    if 0 in lengths:
        raise BadInputError("the text tokenises to zero tokens.")
    device = getattr(model.cfg, "device", None) or "cpu"
    tokens = torch.tensor(rows, dtype=torch.long, device=device)
    check_seq_len(model, tokens.shape[1])
    return tokens


def check_tokens(model: Any, tokens: Tensor) -> None:
    """Raise before any work when a token tensor is not integer or holds ids outside the
    model's vocabulary (an embedding lookup would fail deep inside the forward, or on some
    devices silently read garbage)."""
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise BadInputError(f"tokens must be integer ids, got a {tokens.dtype} tensor.")
    if tokens.numel() == 0:
        raise BadInputError("the token tensor is empty.")
    vocab = int(model.cfg.d_vocab)
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab:
        bad = low if low < 0 else high
        raise BadInputError(
            f"token id {bad} is outside this model's vocabulary (0..{vocab - 1}): pass ids from "
            "this model's tokenizer (mechsink.model.to_tokens)."
        )


def token_strings(model: Any, tokens: Sequence[int] | Tensor) -> list[str]:
    """Readable strings for one row of token ids (the ids as text when there is no tokenizer)."""
    ids = [int(t) for t in (tokens.tolist() if isinstance(tokens, Tensor) else tokens)]
    tok = getattr(model, "tokenizer", None)
    if tok is None:
        return [str(i) for i in ids]
    return [tok.decode([i]) for i in ids]


def _get_act_name() -> Callable[..., str]:
    try:  # TransformerLens 4 renamed ``utils`` to ``utilities`` (same names)
        from transformer_lens.utilities import get_act_name
    except ImportError:  # pragma: no cover - TransformerLens 2/3
        from transformer_lens.utils import get_act_name
    return get_act_name


def act_name(name: str, layer: int | None = None) -> str:
    """The full hook name of ``name`` at ``layer``, in TransformerLens's vocabulary.

    ``name`` is a short form TransformerLens's ``get_act_name`` knows (``"pattern"``, ``"z"``,
    ``"resid_pre"``, ``"mlp_out"``, ``"post"``, ...), a hook name relative to a block
    (``"attn.hook_z"``, ``"hook_mlp_out"``, ``"mlp.hook_post"``), or a full name, returned as is.
    """
    if name.startswith("blocks.") or (layer is None and name.startswith("hook_")):
        return name
    if "hook_" in name:  # relative to a block
        if layer is None:
            raise BadInputError(f"hook {name!r} lives in a block: give its layer.")
        return f"blocks.{layer}.{name}"
    return _get_act_name()(name, layer)


def n_kv_heads(model: Any) -> int:
    """Number of key/value heads (== n_heads unless the model uses grouped-query attention)."""
    n = getattr(model.cfg, "n_key_value_heads", None)
    return int(n) if n else int(model.cfg.n_heads)


def context_length(model: Any) -> int:
    """The longest sequence the model accepts."""
    return int(model.cfg.n_ctx)


def check_seq_len(model: Any, seq_len: int) -> None:
    """Raise before any work when a sequence would not fit the model's context."""
    n_ctx = context_length(model)
    if seq_len < 1:
        raise BadInputError(f"sequence length must be at least 1, got {seq_len}.")
    if seq_len > n_ctx:
        raise BadInputError(
            f"sequence length {seq_len} is longer than the model's context ({n_ctx} tokens): "
            "use a shorter sequence."
        )


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
        "d_mlp": int(cfg.d_mlp) if cfg.d_mlp else None,
        "n_ctx": int(cfg.n_ctx),
        "d_vocab": int(cfg.d_vocab),
        "positional_embedding": str(cfg.positional_embedding_type),
        "normalization": str(cfg.normalization_type),
        "activation": str(cfg.act_fn),
        "gated_mlp": bool(getattr(cfg, "gated_mlp", False)),
        "n_params": sum(p.numel() for p in module.parameters()),
        "dtype": str(cfg.dtype).replace("torch.", ""),
        "bos_token_id": bos_token_id(model),
    }


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
    from mechsink.model.variants import apply_variants, variants_of

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


# =========================================================================================
# Patching support (added for mechsink.patching): run part of the model, stop early, unembed.
# Everything here is generic over TransformerLens models; bridge-specific tricks are guarded.
# =========================================================================================

HookFn = Callable[..., Any]


class _StopForward(Exception):
    """Raised from a hook to end a forward pass once everything a caller needs was seen."""


def hook_names(model: Any) -> set[str]:
    """Every hook name the model exposes (HookedTransformer vocabulary in compatibility mode)."""
    return set(model.hook_dict.keys())


def _decoder_layer_list(model: Any) -> tuple[nn.Module, str] | None:
    """The (parent, attribute) of the transformers ModuleList that holds the model's blocks.

    The bridge's ``blocks[i]`` are the very modules the wrapped transformers model iterates
    over, so we look for the ModuleList whose first entry is ``blocks[0]``. None for models
    that are not bridges (a HookedTransformer skips earlier blocks by itself).
    """
    try:
        hf = hf_model_of(model)
    except BadInputError:
        return None
    first = model.blocks[0]
    for name, module in hf.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) and module[0] is first:
            parent_name, _, attr = name.rpartition(".")
            return (hf.get_submodule(parent_name) if parent_name else hf), attr
    return None


@contextmanager
def _masks_follow_batch(model: Any) -> Iterator[None]:
    """Let a hook grow the batch mid-forward (the patching engine's staircase adds copies at
    later blocks): an attention mask built for the first rows is cut to one row, which every
    row shares (mechsink never pads, so each row's causal mask is the same)."""

    def one_row(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        mask = kwargs.get("attention_mask")
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if (isinstance(mask, Tensor) and mask.ndim == 4 and isinstance(hidden, Tensor)
                and mask.shape[0] not in (1, hidden.shape[0])):
            kwargs = {**kwargs, "attention_mask": mask[:1]}
        return args, kwargs

    handles = [b.attn.register_forward_pre_hook(one_row, with_kwargs=True)
               for b in model.blocks]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def _only_blocks_from(model: Any, start: int) -> Iterator[None]:
    """Make the wrapped model iterate over blocks ``start..`` only (restored on exit).

    TransformerBridge's ``start_at_layer`` still executes blocks ``0..start-1`` and discards
    their output; dropping them from the layer list for the duration of the call skips that
    work. Exactness is checked by the tests (start-at-layer forward == full forward).
    """
    found = _decoder_layer_list(model) if start > 0 else None
    if found is None:
        yield
        return
    parent, attr = found
    full = getattr(parent, attr)
    # models that mix layer kinds (Gemma's sliding-window and global layers) pick each layer's
    # mask and rotary embedding by its index in the list: shift the kinds along with it
    config = getattr(parent, "config", None)
    kinds = getattr(config, "layer_types", None)
    shift_kinds = isinstance(kinds, list) and len(kinds) == len(full)
    setattr(parent, attr, nn.ModuleList(list(full)[start:]))
    if shift_kinds:
        config.layer_types = kinds[start:]
    try:
        yield
    finally:
        setattr(parent, attr, full)
        if shift_kinds:
            config.layer_types = kinds


def _tl_major() -> int:
    """TransformerLens's major version (2, 3, 4, ...)."""
    from importlib.metadata import version

    try:
        return int(version("transformer-lens").split(".")[0])
    except Exception:  # pragma: no cover - an unusual install: assume the newest behaviour
        return 99


def _starts_at_layer(model: Any) -> bool:
    """Whether ``model(resid, start_at_layer=L)`` works: always on a HookedTransformer; on a
    TransformerBridge from TransformerLens 4 on (3.x bridges raise NotImplementedError)."""
    return not is_bridge(model) or _tl_major() >= 4


def _old_bridge_error() -> MissingDependencyError:
    from importlib.metadata import version

    have = version("transformer-lens")
    why = ("has no TransformerBridge" if _tl_major() < 3
           else "has a bridge that cannot run from a layer")
    return MissingDependencyError(
        f"mechsink's TransformerBridge support needs TransformerLens 4 (this is {have}, which "
        f"{why}): install "
        "'transformer-lens>=4.3,<5', or keep this TransformerLens and pass a HookedTransformer "
        "(built with fold_ln=False, center_writing_weights=False, center_unembed=False for the "
        "raw weights' residual stream)."
    )


def run_from_layer(
    model: Any,
    resid: Float[Tensor, "batch pos d_model"],
    start: int,
    *,
    fwd_hooks: Sequence[tuple[str, HookFn]] = (),
    stop_after: Collection[str] = (),
    prefix: tuple[PrefixKV, int] | tuple[PrefixKV, int, Sequence[int]] | None = None,
) -> Float[Tensor, "rows pos d_vocab"] | None:
    """Run blocks ``start..`` on ``resid`` (the residual entering block ``start``) with hooks.

    With ``stop_after`` the pass ends as soon as each named hook has fired once (later blocks,
    the final norm and the unembedding are skipped) and None is returned; otherwise the logits.
    With ``prefix=(kv, p)``, ``resid`` holds positions ``p..`` only and attention reads the
    keys and values of positions ``< p`` from ``kv`` (every hook then sees positions ``p..``;
    ``hook_pattern`` is ``[batch, head, query p.., key 0..]``). Hooks are always removed, also
    when a hook or the model raises.
    """
    n_layers = int(model.cfg.n_layers)
    if not 0 <= start < n_layers:
        raise BadInputError(f"start layer {start} is outside 0..{n_layers - 1}.")
    pending = set(stop_after)
    hooks = list(fwd_hooks)

    def make_stopper(name: str) -> HookFn:
        def stopper(act: Tensor, hook: Any) -> None:
            pending.discard(name)
            if not pending:
                raise _StopForward

        return stopper

    hooks += [(name, make_stopper(name)) for name in sorted(pending)]
    if is_hooked_transformer(model):  # its first block's hooks see ``resid`` itself, and
        resid = resid.clone()         # patches write in place: keep the caller's tensor intact
    kwargs: dict[str, Any] = {}
    reads_cache: Any = nullcontext()
    if prefix is not None and prefix[1] > 0:
        kv, first = prefix[0], prefix[1]
        # a third entry gives the copies entering each layer (a batch that grows on the way)
        copies = prefix[2] if len(prefix) > 2 else resid.shape[0] // kv.keys[0].shape[0]
        if is_hooked_transformer(model):
            kwargs = {"past_kv_cache": kv.cache_for(first, copies)}
        else:
            kwargs = {"cache": kv.cache_for(first, copies), "use_cache": True}
            reads_cache = _attention_reads_cache(model)
    if not _starts_at_layer(model):
        raise _old_bridge_error()
    try:
        with model.hooks(fwd_hooks=hooks), _only_blocks_from(model, start), reads_cache, \
                _masks_follow_batch(model):
            logits = model(resid, start_at_layer=start, return_type="logits", **kwargs)
    except _StopForward:
        return None
    if stop_after:
        raise RuntimeError(f"hooks {sorted(pending)} never fired in a forward from layer {start}.")
    return logits


def unembed(
    model: Any, resid_final: Float[Tensor, "batch pos d_model"]
) -> Float[Tensor, "batch pos d_vocab"]:
    """Logits from the last block's output: final norm, then unembedding (for a few positions)."""
    return model.unembed(model.ln_final(resid_final))


# --- census support (mechsink.measure.census): hook presence and the weights measurements read


def has_hook(model: Any, name: str) -> bool:
    """True when the model offers a hook point of this exact name."""
    return name in model.hook_dict


def down_projection(model: Any) -> Tensor:
    """The MLP down projections stacked over layers, ``[layer, d_mlp, d_model]`` (raw weights,
    detached): ``mlp.hook_post @ W_out[l] (+ b_out) = hook_mlp_out``."""
    try:
        weight = model.W_out
    except (AttributeError, RuntimeError) as exc:
        raise BadInputError(f"this model exposes no MLP down projection (W_out): {exc}") from exc
    return weight.detach()


def head_output_weights(model: Any) -> Tensor:
    """The attention output projections per head, ``[layer, head, d_head, d_model]`` (raw,
    detached): ``hook_z[..., h, :] @ W_O[l, h]`` is head ``h``'s write to the residual stream."""
    try:
        weight = model.W_O
    except (AttributeError, RuntimeError) as exc:
        raise BadInputError(f"this model exposes no attention output weights (W_O): {exc}") from exc
    return weight.detach()


def _grouped(model: Any) -> bool:
    """A HookedTransformer with grouped-query attention: its ``W_K``/``b_K`` (and ``W_V``/``b_V``)
    properties repeat each KV head once per query head; the per-KV-head weights are ``_W_K``."""
    n_kv = getattr(model.cfg, "n_key_value_heads", None)
    return is_hooked_transformer(model) and bool(n_kv) and int(n_kv) != int(model.cfg.n_heads)


def key_weights(model: Any) -> Tensor:
    """The key projections per KV head, ``[layer, kv_head, d_model, d_head]`` (raw, detached):
    ``hook_k[..., g, :] = x @ W_K[l, g] + b_K[l, g]`` on either kind of model."""
    if _grouped(model):
        return torch.stack([b.attn._W_K for b in model.blocks]).detach()
    return model.W_K.detach()


def key_bias(model: Any) -> Tensor | None:
    """The key biases per KV head, ``[layer, kv_head, d_head]`` (detached), or None when the
    model has none."""
    if _grouped(model):
        return torch.stack([b.attn._b_K for b in model.blocks]).detach()
    b_k = getattr(model, "b_K", None)
    return None if b_k is None else b_k.detach()


def query_bias(model: Any, layer: int) -> Tensor | None:
    """The learned query bias ``b_Q`` of a block, ``[head, d_head]`` (detached), or None when
    the model's query projection has no bias (Llama, Gemma, SmolLM2)."""
    try:
        b_q = model.b_Q
    except (AttributeError, RuntimeError):
        return None
    return None if b_q is None else b_q[layer].detach()


@contextmanager
def scale_edits_expected() -> Iterator[None]:
    """Silence TransformerLens's warning that a hook edited a norm's ``hook_scale`` (it then
    rebuilds the norm's output from the hooked values): freezing the scales is that edit."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="A forward hook edited hook_scale")
        yield


def write_in_place(act: Tensor, new: Tensor) -> Tensor:
    """Overwrite a hooked activation in place and return it (what a patching hook should do).

    On TransformerBridge some HookedTransformer names are aliases of a submodule's input: e.g.
    ``blocks.L.hook_resid_mid`` is ``blocks.L.ln2.hook_in``. Returning a new tensor from such a
    hook changes only that submodule's input (the MLP sees the patch, the residual skip does not);
    writing in place changes the shared residual tensor too, which is HookedTransformer's meaning
    of the name and what ``transformer_lens.patching`` (whose setters write in place) computes.
    The new tensor (not ``act``) is returned as well, because some bridge components (the
    norms' ``hook_scale``/``hook_normalized``) detect an edit by object identity only.
    """
    if not (act.requires_grad and act.is_leaf):
        act.copy_(new)
    return new


def norm_params(model: Any, layer: int, which: str = "ln1") -> tuple[Tensor, Tensor | None]:
    """Gain and bias of a block's normalisation (``ln1`` before attention, ``ln2`` before the
    MLP); the bias is None for RMSNorm."""
    norm = getattr(model.blocks[layer], which)
    bias = getattr(norm, "b", None)
    return norm.w, bias


# --- prefix reuse: attention that reads the keys/values of earlier positions from a cache -----


class PrefixKV:
    """Keys and values every attention layer used on one run, recorded by :func:`run_with_kv`,
    in the model's own cache layout: on a TransformerBridge ``[batch, kv_head, pos, d_head]``
    per layer, post-rotary where the model rotates keys (a transformers cache); on a
    HookedTransformer ``[batch, pos, kv_head, d_head]``, before rotary (its ``past_kv_cache``).

    A later run of positions ``p..`` from some layer on reads positions ``< p`` from here
    (:func:`run_from_layer`'s ``prefix=``): in a causal model, a patch at positions ``>= p``
    leaves every earlier position's keys and values unchanged.
    """

    def __init__(self, model: Any, keys: list[Tensor], values: list[Tensor]) -> None:
        self.hooked = is_hooked_transformer(model)
        self.config = None if self.hooked else hf_model_of(model).config
        self.n_layers = int(model.cfg.n_layers)  # keys/values may stop earlier (run_with_kv)
        self.keys, self.values = keys, values

    def rows(self, rows: slice) -> PrefixKV:
        """The keys and values of some rows of the recorded batch (views, not copies)."""
        part = copy.copy(self)
        part.keys = [k[rows] for k in self.keys]
        part.values = [v[rows] for v in self.values]
        return part

    def cache_for(self, first: int, copies: int | Sequence[int]) -> Any:
        """A fresh cache holding positions ``< first``, repeated ``copies`` times along the
        batch (copy-major, like the stacked patch batches); a sequence gives each layer its
        own number of copies (0: the layer is not run; it still holds one copy, because
        transformers reads the cached length off layer 0)."""
        per_layer = [copies] * self.n_layers if isinstance(copies, int) else list(copies)
        # a run recorded up to some block: the layers after it hold a placeholder (0 copies),
        # never read, because the runs that use this cache stop there too
        recorded = len(self.keys)
        per_layer[recorded:] = [0] * (self.n_layers - recorded)
        keys = self.keys + [self.keys[-1]] * (self.n_layers - recorded)
        values = self.values + [self.values[-1]] * (self.n_layers - recorded)
        if self.hooked:
            return [_FrozenKVEntry(k[:, :first].repeat(c, 1, 1, 1),
                                   v[:, :first].repeat(c, 1, 1, 1))
                    for k, v, c in zip(keys, values, per_layer, strict=True)]
        from transformers import DynamicCache

        cache = DynamicCache(config=self.config)
        for layer, (k, v, c) in enumerate(zip(keys, values, per_layer, strict=True)):
            cache.update(k[:, :, :first].repeat(max(c, 1), 1, 1, 1),
                         v[:, :, :first].repeat(max(c, 1), 1, 1, 1), layer)
        return cache


class _FrozenKVEntry:
    """One layer of a HookedTransformer ``past_kv_cache`` that is read, never extended (the
    interface of TransformerLens's frozen cache entry: ``past_keys`` and ``append``)."""

    def __init__(self, keys: Tensor, values: Tensor) -> None:
        self.past_keys, self.past_values, self.frozen = keys, values, True

    def append(self, new_keys: Tensor, new_values: Tensor) -> tuple[Tensor, Tensor]:
        return (torch.cat([self.past_keys, new_keys], dim=1),
                torch.cat([self.past_values, new_values], dim=1))


def _hooked_kv_names(model: Any) -> list[tuple[str, str]] | None:
    """Per layer, the hooks holding what a HookedTransformer's attention caches (keys before
    rotary, values, both per KV head); None when that is not what its cache would hold."""
    cfg = model.cfg
    if getattr(cfg, "positional_embedding_type", "standard") not in ("standard", "rotary"):
        return None  # shortformer / alibi add position terms outside the cached keys
    if getattr(cfg, "use_split_qkv_input", False) or getattr(cfg, "window_size", None):
        return None
    names = [(act_name("k", layer), act_name("v", layer)) for layer in range(int(cfg.n_layers))]
    hooks = model.hook_dict
    return names if all(k in hooks and v in hooks for k, v in names) else None


def supports_prefix_reuse(model: Any) -> bool:
    """True for models whose attention can extend keys/values from a cache: TransformerLens 4
    bridges whose attention blocks take a transformers cache, and HookedTransformers (their
    ``past_kv_cache``) with standard or rotary positions."""
    if is_hooked_transformer(model):
        return _hooked_kv_names(model) is not None
    try:
        hf_model_of(model)
    except BadInputError:
        return False
    if not _starts_at_layer(model):
        return False
    blocks = getattr(model, "blocks", None)
    return bool(blocks) and all(hasattr(getattr(b, "attn", None), "_update_kv_cache")
                                for b in blocks)


@contextmanager
def _attention_reads_cache(model: Any) -> Iterator[None]:
    """Let the bridge's attention find the transformers cache under either keyword.

    transformers 5 hands the cache to attention as ``cache=``; TransformerLens 4.3's attention
    components look for ``past_key_values=`` only, so without this they would neither record
    nor read cached keys and values.
    """
    attns = [b.attn for b in model.blocks]
    for attn in attns:
        original = attn._update_kv_cache

        def update(k: Tensor, v: Tensor, _original: Any = original, **kw: Any) -> Any:
            if kw.get("past_key_values") is None and kw.get("cache") is not None:
                kw["past_key_values"] = kw["cache"]
            return _original(k, v, **kw)

        attn._update_kv_cache = update
    try:
        yield
    finally:
        for attn in attns:
            attn.__dict__.pop("_update_kv_cache", None)


def run_with_kv(
    model: Any, tokens: Int[Tensor, "batch pos"], names: Collection[str],
    last_layer: int | None = None,
) -> tuple[Float[Tensor, "batch pos d_vocab"] | None, dict[str, Tensor], PrefixKV | None]:
    """One forward: logits, the activations ``names`` and (where supported) every layer's keys
    and values, for later runs that reuse this run's prefix. With ``last_layer`` the forward
    ends after that block (no logits; keys and values of blocks ``0..last_layer`` only, for
    runs that stop there too). Hooks are removed afterwards."""
    wanted = set(names)
    stop = last_layer is not None and last_layer < int(model.cfg.n_layers) - 1
    n_kv = int(model.cfg.n_layers) if not stop else int(last_layer) + 1  # type: ignore[arg-type]
    if not supports_prefix_reuse(model):
        logits, acts = _run_capturing(model, tokens, wanted, last_layer if stop else None)
        return logits, acts, None
    if is_hooked_transformer(model):
        kv_names = _hooked_kv_names(model)
        assert kv_names is not None
        kv_names = kv_names[:n_kv]
        every = wanted | {n for pair in kv_names for n in pair}
        logits, acts = _run_capturing(model, tokens, every, last_layer if stop else None)
        kv = PrefixKV(model, [acts[k] for k, _ in kv_names], [acts[v] for _, v in kv_names])
        return logits, {n: a for n, a in acts.items() if n in wanted}, kv
    from transformers import DynamicCache

    record = DynamicCache(config=hf_model_of(model).config)
    with _attention_reads_cache(model):
        logits, acts = _run_capturing(model, tokens, wanted, last_layer if stop else None,
                                      cache=record, use_cache=True)
    layers = record.layers[:n_kv]
    if len(layers) != n_kv or any(
        x.keys is None or x.keys.shape[2] != tokens.shape[1] for x in layers
    ):  # this model did not record every position (or keeps a window only): no reuse
        return logits, acts, None
    kv = PrefixKV(model, [x.keys for x in layers], [x.values for x in layers])
    return logits, acts, kv


def _run_capturing(
    model: Any, tokens: Tensor, names: set[str], last_layer: int | None, **kwargs: Any
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """A forward keeping the activations ``names``; with ``last_layer``, ending after that
    block's output (logits None). Hooks are removed afterwards, also on an error."""
    if last_layer is None:
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, **kwargs)
        return logits, dict(cache.cache_dict)
    acts: dict[str, Tensor] = {}

    def keep_as(name: str) -> HookFn:  # keyed by the name asked for (hooks have aliases)
        def keep(act: Tensor, hook: Any) -> None:
            acts[name] = act.detach()

        return keep

    def stopper(act: Tensor, hook: Any) -> None:
        raise _StopForward

    hooks = [(n, keep_as(n)) for n in sorted(names)] + [
        (act_name("resid_post", last_layer), stopper)]
    try:
        with model.hooks(fwd_hooks=hooks):
            model(tokens, **kwargs)
    except _StopForward:
        pass
    missing = sorted(names - set(acts))
    if missing:
        raise BadInputError(f"hooks {missing} did not fire before block {last_layer} ended.")
    return None, acts
