"""What a model really does, measured once by cheap probes: which hooks fire, whether a forward
from a later layer uses the residual it is given, whether mechsink's own unembedding equals the
model's logits.

TransformerLens declares hooks and options per architecture that do not always hold (rotary
hooks that never fire on fused-QKV models, a ``start_at_layer`` that Bloom's bridge ignores).
The engine's shortcuts are taken only where a probe here proved them exact; the probes run one
short forward each (2 sequences of 3 tokens) and are cached per model.
"""

from __future__ import annotations

import re
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from mechsink.errors import BadInputError
from mechsink.model.hooks import KINDS
from mechsink.model.patches.growing_batch import masks_follow_batch
from mechsink.model.shortcuts import start_forward, unembed

PROBE_TOL = 1e-4  # relative to the largest logit (at least 1)

_CACHE: weakref.WeakKeyDictionary[Any, Capabilities] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Capabilities:
    """Per model: the per-block hook suffixes that fire in a forward (``attn.hook_q``, ...; at
    block 0, and in every block), whether ``start_at_layer`` uses the residual given, whether
    :func:`mechsink.model.unembed` equals the model's own logits, and the largest differences
    the probes saw."""

    hooks_fire: frozenset[str]
    start_at_layer: bool
    unembed_exact: bool
    start_diff: float
    unembed_diff: float
    batch_growth: frozenset[str] = frozenset()  # hooks where copies may join the batch
    hooks_everywhere: frozenset[str] = frozenset()  # suffixes that fire in every block
    #: largest gap between a block's output and its input plus its attention and MLP outputs,
    #: relative to the output's size (nan: the hooks to tell do not fire), and the gap the
    #: model's dtype allows for rounding (a half-precision sum is ~1e-3 off)
    residual_diff: float = float("nan")
    residual_tol: float = PROBE_TOL

    @property
    def residual_additive(self) -> bool:
        """Each block adds its attention and MLP outputs to the residual stream and nothing
        else (False for post-LN blocks, which normalise the residual itself: a gap of order
        1; True when the hooks to tell do not fire)."""
        return not self.residual_diff > self.residual_tol
    hooks_per_block: tuple[frozenset[str], ...] = ()  # per block, the suffixes that fire

    def fires_everywhere(self, suffix: str) -> bool:
        """Whether the per-block hook ``suffix`` fires in every block (a hybrid model's
        attention hooks fire in its attention layers only)."""
        return suffix in self.hooks_everywhere

    def fires_at(self, name: str) -> bool:
        """Whether the hook ``name`` fires in a forward: a per-block hook
        (``blocks.<l>.<suffix>``) in its own block; any other hook (``hook_embed``, ...) is
        not probed and counts as firing."""
        parts = name.split(".", 2)
        if len(parts) < 3 or parts[0] != "blocks" or not parts[1].isdigit():
            return True
        layer, suffix = int(parts[1]), parts[2]
        if layer < len(self.hooks_per_block):
            return suffix in self.hooks_per_block[layer]
        return suffix in self.hooks_everywhere

    def grows_at(self, suffix: str) -> bool:
        """Whether copies may join the batch at the per-block hook ``suffix`` mid-forward (the
        patching engine's staircase) and every row still gets its exact logits."""
        return suffix in self.batch_growth

    @property
    def split_qkv(self) -> bool:
        """Per-head queries, keys and values (``attn.hook_q/k/v``) fire."""
        return {"attn.hook_q", "attn.hook_k", "attn.hook_v"} <= self.hooks_fire

    @property
    def rotary_qk(self) -> bool:
        """Rotated queries and keys (``attn.hook_rot_q/k``) fire."""
        return {"attn.hook_rot_q", "attn.hook_rot_k"} <= self.hooks_fire

    def fires(self, suffix: str) -> bool:
        """Whether the per-block hook ``suffix`` fires (at block 0)."""
        return suffix in self.hooks_fire


def probe_tokens(model: Any) -> torch.Tensor:
    """Two 3-token sequences of distinct, valid ids (different sequences: a residual swapped
    between them must change the logits)."""
    vocab = int(model.cfg.d_vocab)
    ids = torch.tensor([[0, 1 % vocab, 2 % vocab], [3 % vocab, 4 % vocab, 5 % vocab]])
    device = getattr(model.cfg, "device", None)
    return ids.to(device) if device is not None else ids


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).abs().max() / b.abs().max().clamp_min(1.0)).item()


@torch.no_grad()
def _probe(model: Any) -> Capabilities:
    n_layers = int(model.cfg.n_layers)
    tokens = probe_tokens(model)
    logits, cache = model.run_with_cache(tokens)
    per_block = [frozenset(k.split(".", 2)[2] for k in cache.keys()
                           if k.startswith(f"blocks.{layer}.")) for layer in range(n_layers)]
    fired, everywhere = per_block[0], frozenset.intersection(*per_block)
    last = f"blocks.{n_layers - 1}"
    unembed_diff = _rel(unembed(model, cache[f"{last}.hook_resid_post"]), logits) \
        if f"{last}.hook_resid_post" in cache.keys() else float("inf")
    start_diff = float("inf")
    name = f"{last}.hook_resid_pre"
    if name in cache.keys():
        resid = cache[name]
        try:
            same = start_forward(model, resid.clone(), n_layers - 1)
            swapped = start_forward(model, resid.flip(0).clone(), n_layers - 1)
            start_diff = max(_rel(same, logits), _rel(swapped, logits.flip(0)))
        except Exception:  # noqa: BLE001 - any failure means: not usable on this model
            start_diff = float("inf")
    growth = frozenset(s for s in GROWTH_SITES
                       if s in fired and _grows(model, tokens, logits, s, per_block[-1]))
    return Capabilities(fired, start_diff <= PROBE_TOL, unembed_diff <= PROBE_TOL,
                        start_diff, unembed_diff, growth, everywhere,
                        residual_diff=_residual_gap(cache), residual_tol=_sum_tol(cache),
                        hooks_per_block=tuple(per_block))


def _sum_tol(cache: Any) -> float:
    """The rounding a sum of the residual's dtype allows, relative (16 machine epsilons)."""
    name = "blocks.0.hook_resid_pre"
    if name not in cache.keys() or not cache[name].is_floating_point():
        return PROBE_TOL
    return max(PROBE_TOL, 16 * torch.finfo(cache[name].dtype).eps)


def _residual_gap(cache: Any) -> float:
    """max over blocks of ``|out - (resid_pre + attn_out + mlp_out)| / max |out|``, ``out``
    the next block's ``hook_resid_pre`` (the last block's ``hook_resid_post``); nan when no
    block has the hooks."""
    gaps, layer = [], 0
    while f"blocks.{layer}.hook_resid_pre" in cache.keys():
        here = [f"blocks.{layer}.{s}" for s in ("hook_resid_pre", "hook_attn_out",
                                                "hook_mlp_out")]
        out = next((n for n in (f"blocks.{layer + 1}.hook_resid_pre",
                                f"blocks.{layer}.hook_resid_post") if n in cache.keys()), None)
        if out is not None and all(n in cache.keys() for n in here):
            gaps.append(_rel(cache[here[0]] + cache[here[1]] + cache[here[2]], cache[out]))
        layer += 1
    return max(gaps) if gaps else float("nan")


GROWTH_SITES = ("hook_resid_pre",)  # the staircase adds copies at block inputs


def _grows(model: Any, tokens: torch.Tensor, logits: torch.Tensor, suffix: str,
           fired: frozenset[str] = frozenset()) -> bool:
    """A forward whose batch doubles at the last block's ``suffix`` (each row copied) gives
    every copy its row's logits, and every patchable hook of that block that fires
    (``fired``; the in-block kinds of :data:`~mechsink.model.hooks.KINDS`) sees the grown batch
    first: a hooked activation reshaped from the batch the block started with (OPT's MLP
    hooks, unflattened from ``[batch * pos, d]`` with the batch stamped at the block's entry)
    would be patched in the wrong shape."""
    layer = int(model.cfg.n_layers) - 1
    rows = 2 * int(tokens.shape[0])
    wrong: list[str] = []

    def double(act: torch.Tensor, hook: Any) -> torch.Tensor:
        return torch.cat([act, act])

    def check(act: torch.Tensor, hook: Any) -> None:
        if isinstance(act, torch.Tensor) and act.shape[0] != rows:
            wrong.append(hook.name)

    name = f"blocks.{layer}.{suffix}"
    patchable = {k.hook for k in KINDS.values() if k.in_block}
    watched = [(f"blocks.{layer}.{s}", check) for s in sorted(fired - {suffix})
               if s in patchable]
    try:
        with model.hooks(fwd_hooks=[(name, double), *watched]), masks_follow_batch(model):
            grown = model(tokens, return_type="logits")
    except Exception:  # noqa: BLE001 - any failure means: do not grow the batch here
        return False
    return not wrong and tuple(grown.shape) == (2 * logits.shape[0], *logits.shape[1:]) and \
        _rel(grown, torch.cat([logits, logits])) <= PROBE_TOL


def capabilities(model: Any) -> Capabilities:
    """The model's :class:`Capabilities`, probed on first use and cached on the model."""
    try:
        return _CACHE[model]
    except (KeyError, TypeError):
        pass
    if not hasattr(model, "cfg") or not hasattr(model, "run_with_cache"):
        raise BadInputError(f"capabilities() takes a mechsink model (mechsink.wrap), not a "
                            f"{type(model).__name__}.")
    found = _probe(model)
    try:
        _CACHE[model] = found
    except TypeError:  # not weak-referenceable: probe again next time
        pass
    return found


_SPLIT: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()


def split_inputs_problem(model: Any) -> str | None:
    """What is wrong with the model's per-head query/key/value inputs (``use_split_qkv_input``:
    ``blocks.<l>.hook_q/k/v_input``, ``[batch, pos, head, d_model]``), or None when they
    work: the switch turns on, the hooks fire holding the residual stream entering the block
    (each head's copy equal to ``hook_resid_pre``, normalised after the hook), and a vector
    added to every head's copy gives the same ``hook_q/k/v`` as the same vector added to the
    residual stream (a check that holds whatever the weights). Edge discovery's receivers
    read there; a bridge that never fires them (MPT's, before
    :mod:`mechsink.model.patches.alibi_qkv_fork`) drops every edit, one that forks the
    normalised input (Bloom's, before
    :mod:`mechsink.model.patches.bloom_block_inputs`) skips the norm. Probed once per model
    (at most five forwards of :func:`probe_tokens`), the switch restored."""
    try:
        return _SPLIT[model]
    except (KeyError, TypeError):
        pass
    found = _split_problem(model)
    try:
        _SPLIT[model] = found
    except TypeError:
        pass
    return found


@torch.no_grad()
def _split_problem(model: Any) -> str | None:
    last = int(model.cfg.n_layers) - 1
    # the vocabulary's names (mechsink.names): a HookedTransformer has only these, a bridge
    # aliases them to its attn.hook_q/k/v_input
    names = {x: f"blocks.{last}.hook_{x}_input" for x in "qkv"}
    resid = f"blocks.{last}.hook_resid_pre"
    if any(n not in model.hook_dict for n in names.values()):
        return "are not declared (no blocks.<l>.hook_q/k/v_input)"
    before = bool(getattr(model.cfg, "use_split_qkv_input", False))
    try:
        model.set_use_split_qkv_input(True)
    except Exception as exc:  # noqa: BLE001 - any failure: the switch does not work here
        found = re.search(r"Found attention classes: (\[[^\]]*\])", str(exc))
        why = f"TransformerLens supports them on none of {found.group(1)}" if found else \
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
        return f"cannot be switched on (use_split_qkv_input; {why})"
    try:
        return _split_checks(model, names, resid)
    except Exception as exc:  # noqa: BLE001 - a forward that fails with them on
        return f"make the forward fail ({type(exc).__name__}: {str(exc).splitlines()[0][:80]})"
    finally:
        model.set_use_split_qkv_input(before)


def _split_checks(model: Any, names: dict[str, str], resid: str) -> str | None:
    tokens = probe_tokens(model)
    seen: dict[str, torch.Tensor] = {}

    def recorder(name: str) -> Any:  # keyed by the name asked for (a hook may be an alias)
        def record(act: torch.Tensor, hook: Any) -> None:
            seen[name] = act.detach().clone()
        return record

    hooks = [(n, recorder(n)) for n in (*names.values(), resid) if n in model.hook_dict]
    model.run_with_hooks(tokens, fwd_hooks=hooks)
    for x, name in names.items():
        if name not in seen:
            return f"never fire (blocks.<l>.hook_{x}_input)"
        if resid in seen and _rel(seen[name], seen[resid].unsqueeze(2).expand_as(
                seen[name])) > PROBE_TOL:
            return (f"do not hold the residual stream entering the block (hook_{x}_input "
                    "differs from hook_resid_pre: the input forked after the block's norm?)")
    # the same push on every head's copy and on the residual itself gives the same q/k/v
    # (whatever the weights: a head whose query weights are 0 ignores both alike)
    if resid not in seen:
        return None
    act = seen[names["q"]]
    gen = torch.Generator().manual_seed(0)
    push = torch.randn(act.shape[-1], generator=gen).to(act)
    push = push / push.norm() * act.norm(dim=-1).max()
    outs = {x: name.replace(f"hook_{x}_input", f"attn.hook_{x}") for x, name in names.items()}
    hooks = [(o, recorder("want." + o)) for o in outs.values() if o in model.hook_dict]
    model.run_with_hooks(tokens, fwd_hooks=[(resid, lambda a, hook: a + push), *hooks])
    for x, name in names.items():
        if "want." + outs[x] not in seen:
            continue  # hook_q/k/v do not fire: nothing to compare with
        model.run_with_hooks(tokens, fwd_hooks=[(name, lambda a, hook: a + push),
                                                (outs[x], recorder("got." + outs[x]))])
        if _rel(seen["got." + outs[x]], seen["want." + outs[x]]) > PROBE_TOL:
            return (f"ignore edits (an edit of hook_{x}_input does not reach hook_{x} as the "
                    "same edit of the residual stream does)")
    return None


#: the per-block hooks an edit of which must reach the attention's output: the pattern (what
#: attend_only_to_self and pattern patching write) and the pre-softmax scores (mask edits)
PATTERN_EDIT_HOOKS = ("attn.hook_pattern", "attn.hook_attn_scores")

_EDITS: weakref.WeakKeyDictionary[Any, dict[str, str | None]] = weakref.WeakKeyDictionary()


def edit_problem(model: Any, suffix: str) -> str | None:
    """What is wrong with editing the per-block hook ``suffix`` (one of
    :data:`PATTERN_EDIT_HOOKS`), or None when an edit there reaches the model's output.

    A bridge whose attention runs transformers' own attention module (XGLM's, JetMoE's) may
    fire ``hook_pattern`` on a pattern it recomputed after the fact: the hook sees the right
    values, but what a hook returns is discarded, so ``attend_only_to_self`` and pattern
    patching would silently do nothing. The probe sets the pattern of the last block where the
    hook fires to the identity (every query attends to itself; for the scores, every other key
    masked) on :func:`probe_tokens` and compares the logits with the unedited ones: an edit
    that moves them by less than :data:`PROBE_TOL` is discarded. One forward (two with the
    cached clean logits), cached per model and hook."""
    if suffix not in PATTERN_EDIT_HOOKS:
        raise BadInputError(f"edit_problem() probes {', '.join(PATTERN_EDIT_HOOKS)}, not "
                            f"{suffix!r}.")
    try:
        done = _EDITS.setdefault(model, {})
    except TypeError:  # not weak-referenceable: probe again next time
        done = {}
    if suffix not in done:
        done[suffix] = _edit_problem(model, suffix)
    return done[suffix]


@torch.no_grad()
def _edit_problem(model: Any, suffix: str) -> str | None:
    caps = capabilities(model)
    layers = [layer for layer, fired in enumerate(caps.hooks_per_block) if suffix in fired]
    if not layers:
        return None  # never fires: the entry points' hook checks refuse it
    name = f"blocks.{layers[-1]}.{suffix}"
    tokens = probe_tokens(model)

    def identity(act: torch.Tensor, hook: Any) -> torch.Tensor:
        n_q, n_k = act.shape[-2], act.shape[-1]
        own = torch.eye(n_q, n_k, dtype=torch.bool, device=act.device)  # query i -> key i
        if suffix == "attn.hook_pattern":
            return own.to(act.dtype).expand_as(act).clone()
        return torch.where(own, act, torch.full_like(act, torch.finfo(act.dtype).min))

    clean = model(tokens, return_type="logits")
    with warnings.catch_warnings():  # TransformerLens warns of the discarded edit: we say it
        warnings.simplefilter("ignore")
        edited = model.run_with_hooks(tokens, return_type="logits",
                                      fwd_hooks=[(name, identity)])
    if _rel(edited, clean) > PROBE_TOL:
        return None
    return (f"ignore edits of {suffix} (setting {name} to attend-to-self leaves the logits "
            "unchanged: the hook fires on values the attention computed, and what it returns "
            "is discarded)")
