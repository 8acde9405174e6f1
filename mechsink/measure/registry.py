"""The census's measurements, one entry each: what :func:`mechsink.measure.census.census` reads.

An entry names its :class:`~mechsink.measure.census.RunCensus` attribute, the per-block hooks it
reads (or a function of the model giving them), its pure function of a cache (with the model's
weights and the census settings in a :class:`CensusContext`), how chunks of sequences merge
(default: the result's own ``merge``) and its JSON (default: the result's ``to_dict()``, whose
keys go straight into the run's object in ``census.json``; document them in
``docs/census-schema.md``). Adding a census measurement is one module under
:mod:`mechsink.measure` and one entry in :data:`CENSUS_MEASUREMENTS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure import (
    experts,
    keys,
    learned_sinks,
    massive,
    norms,
    quantization,
    secondary,
    sinks,
    super_neurons,
    value_share,
    variance,
)
from mechsink.measure.cache import CacheLike
from mechsink.measure.forward import Measurement, merge_chunks
from mechsink.model.moe import moe_experts
from mechsink.model.probes import capabilities


@dataclass(frozen=True)
class CensusContext:
    """What a census measurement may read besides the cache: the model's stacked weights and
    the census settings."""

    w_out: Float[Tensor, "layer d_mlp d_model"] | None  # MLP down projections (None: none)
    w_o: Float[Tensor, "layer head d_head d_model"]  # attention output projections
    eps: float = sinks.DEFAULT_EPS  # sink-rate threshold
    position: int = 0  # the key position the sink scores are of
    no_w_out: str = ""  # why w_out is None (a mixture-of-experts MLP has no single one)
    post_norms: tuple[Any, ...] = ()  # per block the post-MLP norm (None: none); see model
    b_out: Float[Tensor, "layer d_model"] | None = None  # down projection biases
    moe: Any = None  # mechsink.model.moe_experts: per block Experts, None (dense) or why not
    qk_hooks: tuple[str, str] | None = None  # the scored q/k (keys.scored_qk_hooks); None: guess
    tokens: Tensor | None = None  # the chunk's token ids [batch, pos] (given per forward)
    decode: Callable[[Tensor], list[str]] | None = None  # one row of ids -> token strings

    def down_projections(self) -> Float[Tensor, "layer d_mlp d_model"]:
        """``w_out``, or a BadInputError saying why the model has none."""
        if self.w_out is None:
            raise BadInputError(self.no_w_out or "this model exposes no MLP down projection.")
        return self.w_out


@dataclass(frozen=True)
class NotApplicable:
    """A census measurement that does not apply to this model, and why (written to the run's
    ``not_applicable`` object in ``census.json`` instead of the measurement's keys)."""

    name: str
    reason: str

    @classmethod
    def merge(cls, parts: Sequence[NotApplicable]) -> NotApplicable:
        return parts[0]

    def to_dict(self) -> dict[str, Any]:
        return {"not_applicable": {self.name: self.reason}}


def _to_dict(result: Any) -> dict[str, Any]:
    return result.to_dict()


@dataclass(frozen=True)
class CensusMeasurement:
    """One census measurement (see the module doc)."""

    name: str
    hooks: tuple[str, ...] | Callable[[Any], tuple[str, ...]]
    measure: Callable[[CacheLike, CensusContext], Any]
    merge: Callable[[Sequence[Any]], Any] = merge_chunks
    to_json: Callable[[Any], dict[str, Any]] = _to_dict

    def hooks_of(self, model: Any) -> tuple[str, ...]:
        """The hook suffixes this measurement reads on ``model``."""
        return self.hooks(model) if callable(self.hooks) else self.hooks

    def on(self, model: Any, context: CensusContext) -> Measurement:
        """This entry as a :class:`~mechsink.measure.forward.Measurement` of ``model``.

        Hooks that never fire on the model (probed, :func:`mechsink.model.capabilities`) or a
        BadInputError of the measurement make it :class:`NotApplicable` with the reason,
        never the end of the census."""
        hooks = self.hooks_of(model)
        caps = capabilities(model)
        silent = [h for h in hooks if not caps.fires(h)]
        if silent:
            arch = type(getattr(model, "original_model", model)).__name__
            why = NotApplicable(self.name, f"hook(s) {', '.join(silent)} never fire on this "
                                           f"{arch} (declared by TransformerLens, not called)")
            return Measurement((), lambda forward: why, NotApplicable.merge)

        decode = _decoder(model)

        def read(forward: Any) -> Any:
            try:
                return self.measure(forward.cache, replace(context, tokens=forward.tokens,
                                                           decode=decode))
            except BadInputError as exc:
                return NotApplicable(self.name, str(exc))

        def merge(parts: Sequence[Any]) -> Any:
            na = next((p for p in parts if isinstance(p, NotApplicable)), None)
            return na if na is not None else self.merge(parts)

        return Measurement(hooks, read, merge)


@dataclass(frozen=True)
class ModelFactsMeasurement(CensusMeasurement):
    """An entry whose function also reads static facts of the model, found once per census by
    ``facts(model)`` (e.g. which blocks have a learned sink logit): ``measure(cache, context,
    facts)``, called with ``facts=None`` where no model is at hand (``measure_cache``)."""

    facts: Callable[[Any], Any] = lambda model: None

    def on(self, model: Any, context: CensusContext) -> Measurement:
        facts, measure = self.facts(model), self.measure
        plain = CensusMeasurement(self.name, self.hooks,
                                  lambda cache, c: measure(cache, c, facts),  # type: ignore[call-arg]
                                  self.merge, self.to_json)
        return plain.on(model, context)


def _decoder(model: Any) -> Callable[[Tensor], list[str]]:
    """One row of token ids -> the model's token strings (measurements that name tokens)."""
    from mechsink.model import token_strings

    return lambda ids: token_strings(model, ids)


def _quantized_hooks(model: Any) -> tuple[str, ...]:
    """The activations quantized: the residual stream, and the down-projection input where its
    hook fires (a mixture-of-experts block may have none)."""
    caps = capabilities(model)
    return tuple(h for h in quantization.HOOKS if h == "hook_resid_post" or caps.fires(h))


def _expert_hooks(model: Any) -> tuple[str, ...]:
    """The MoE hooks on a mixture-of-experts model; none on a dense one."""
    return experts.HOOKS if moe_experts(model) is not None else ()


def _experts(cache: CacheLike, c: CensusContext) -> Any:
    if c.moe is None:
        return experts.NoExperts()
    if isinstance(c.moe, str):
        raise BadInputError(f"per-expert super neurons cannot be read: {c.moe}")
    return experts.expert_spikes(cache, c.moe)


def _qk_hooks(model: Any) -> tuple[str, ...]:
    """The vectors the attention score is made of (:func:`mechsink.measure.keys.scored_qk_hooks`:
    after a q/k norm that follows the rotary embedding, else the rotated queries and keys on a
    rotary model, else the plain ones; where they never fire the measurement is not
    applicable: the others would not be what the scores use)."""
    return keys.scored_qk_hooks(model)


def _key_bias_cosine(cache: CacheLike, c: CensusContext) -> Any:
    """The key-bias cosine of the hooks the census chose for the model (``c.qk_hooks``)."""
    return keys.key_bias_cosine(cache, c.qk_hooks)


CENSUS_MEASUREMENTS: tuple[CensusMeasurement, ...] = (
    CensusMeasurement("sinks", sinks.HOOKS,
                      lambda cache, c: sinks.sink_scores(cache, c.position, c.eps)),
    CensusMeasurement("massive", massive.HOOKS,
                      lambda cache, c: massive.massive_activations(cache)),
    CensusMeasurement("mlp", super_neurons.HOOKS,
                      lambda cache, c: super_neurons.mlp_spikes(cache, c.down_projections())),
    CensusMeasurement("super_sets", super_neurons.SET_HOOKS,
                      lambda cache, c: super_neurons.super_neuron_sets(
                          cache, c.down_projections(), post_norms=c.post_norms, b_out=c.b_out)),
    CensusMeasurement("experts", _expert_hooks, _experts),
    CensusMeasurement("norm_ratio", norms.RESID_HOOKS,
                      lambda cache, c: norms.first_token_norm_ratio(cache)),
    CensusMeasurement("value_drain", norms.VALUE_HOOKS,
                      lambda cache, c: norms.value_drain(cache)),
    CensusMeasurement("heads", norms.HEAD_HOOKS,
                      lambda cache, c: norms.head_output_norms(cache, c.w_o)),
    CensusMeasurement("keys", _qk_hooks, _key_bias_cosine),
    CensusMeasurement("variance", variance.HOOKS,
                      lambda cache, c: variance.variance_stats(cache)),
    CensusMeasurement("value_share", value_share.HOOKS,
                      lambda cache, c: value_share.value_shares(cache, c.eps)),
    CensusMeasurement("secondary", secondary.HOOKS,
                      lambda cache, c: secondary.secondary_sinks(cache, c.eps, c.tokens,
                                                                 c.decode)),
    CensusMeasurement("quantization", _quantized_hooks,
                      lambda cache, c: quantization.quantization_errors(cache)),
    ModelFactsMeasurement("learned_sinks",
                          lambda model: learned_sinks.attention_extras(model).hooks(),
                          lambda cache, c, facts=None: learned_sinks.learned_sinks(
                              cache, facts, c.eps),
                          facts=learned_sinks.attention_extras),
)
"""Every census measurement, in the order their JSON is written."""


def measurement_names() -> tuple[str, ...]:
    """The names of the registered measurements (the attributes of a RunCensus)."""
    return tuple(m.name for m in CENSUS_MEASUREMENTS)
