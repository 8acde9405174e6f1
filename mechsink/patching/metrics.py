"""Patching metrics: scalars computed from a (patched) run's logits and/or activations.

A metric declares what it reads (:class:`Needs`: hook names, and which logit positions), so the
engine caches only those, stops the forward after the last hook it reads, and unembeds only the
positions a logit metric looks at. Any plain callable ``fn(logits) -> scalar`` (what
``transformer_lens.patching`` takes) is wrapped as :class:`LogitsMetric` and sees the full logits.
Metrics average over the input batch, so every value is one scalar per patch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.sinks import sink_score as _sink_score
from mechsink.model import act_name

ALL = "all"


@dataclass(frozen=True)
class Needs:
    """What a metric reads: hooks (by name) and logits (None, ``"all"`` or some positions)."""

    hooks: frozenset[str] = frozenset()
    logits: str | tuple[int, ...] | None = None

    def __or__(self, other: Needs) -> Needs:
        if self.logits == ALL or other.logits == ALL:
            logits: str | tuple[int, ...] | None = ALL
        elif self.logits is None or other.logits is None:
            logits = self.logits if other.logits is None else other.logits
        else:
            logits = tuple(sorted(set(self.logits) | set(other.logits)))
        return Needs(self.hooks | other.hooks, logits)


def layer_of(hook: str) -> int | None:
    parts = hook.split(".")
    if len(parts) > 1 and parts[0] == "blocks" and parts[1].isdigit():
        return int(parts[1])
    return None


@dataclass
class Outputs:
    """What a metric sees for one patch: activations it asked for and (some) logits.

    ``logits`` is ``[batch, pos, vocab]`` over all positions, or over ``logit_positions`` only
    (non-negative indices) when the metric asked for a few; use :meth:`logits_at`.
    """

    seq_len: int
    acts: dict[str, Tensor] = field(default_factory=dict)
    logits: Tensor | None = None
    logit_positions: tuple[int, ...] | None = None

    def act(self, name: str) -> Tensor:
        """The captured activation ``name`` (``[batch, ...]``)."""
        return self.acts[name]

    def logits_at(self, pos: int) -> Float[Tensor, "batch vocab"]:
        """Logits at one position (negative counts from the end)."""
        if self.logits is None:
            raise RuntimeError("this metric did not declare that it reads logits")
        p = pos + self.seq_len if pos < 0 else pos
        if self.logit_positions is None:
            return self.logits[:, p]
        return self.logits[:, self.logit_positions.index(p)]


class Metric:
    """Base class: ``needs(model)`` says what is read, ``__call__(outputs)`` gives a scalar.

    Metrics add, subtract and scale: ``SinkScore(5) - 0.5 * ResidNorm(3, 0)``.
    """

    name: str = "metric"
    #: the values the metric cannot leave (``None`` for an open side): a metric at a bound on
    #: both inputs cannot show a patch's effect, and patching warns about it
    bounds: ClassVar[tuple[float | None, float | None] | None] = None

    def needs(self, model: Any) -> Needs:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, out: Outputs) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def bind(self, clean: Outputs) -> Metric:
        """A copy that knows the clean run (for metrics relative to it, such as KL)."""
        return self

    def __add__(self, other: Metric) -> Metric:
        return Combination(((1.0, self), (1.0, other)))

    def __sub__(self, other: Metric) -> Metric:
        return Combination(((1.0, self), (-1.0, other)))

    def __rmul__(self, k: float) -> Metric:
        return Combination(((float(k), self),))

    __mul__ = __rmul__

    def __neg__(self) -> Metric:
        return Combination(((-1.0, self),))


@dataclass(frozen=True, eq=False)
class Combination(Metric):
    """A weighted sum of metrics (built by ``+``, ``-`` and ``*``)."""

    terms: tuple[tuple[float, Metric], ...]

    @property
    def name(self) -> str:  # type: ignore[override]
        return " + ".join(f"{w:g}*{m.name}" for w, m in self.terms)

    def needs(self, model: Any) -> Needs:
        out = Needs()
        for _, m in self.terms:
            out = out | m.needs(model)
        return out

    def __call__(self, out: Outputs) -> Tensor:
        return sum(w * m(out) for w, m in self.terms)  # type: ignore[return-value]

    def bind(self, clean: Outputs) -> Metric:
        return Combination(tuple((w, m.bind(clean)) for w, m in self.terms))


@dataclass(frozen=True, eq=False)
class LogitsMetric(Metric):
    """Any callable on the full logits ``[batch, pos, vocab]`` (TransformerLens's convention)."""

    fn: Callable[[Tensor], Tensor]

    @property
    def name(self) -> str:  # type: ignore[override]
        return getattr(self.fn, "__name__", "logits_metric")

    def needs(self, model: Any) -> Needs:
        return Needs(logits=ALL)

    def __call__(self, out: Outputs) -> Any:  # a user's callable: checked by check_value
        return self.fn(out.logits)


@dataclass(frozen=True, eq=False)
class LogitDiff(Metric):
    """Mean over the batch of ``logit[correct] - logit[incorrect]`` at ``pos``."""

    correct: int
    incorrect: int
    pos: int = -1
    name: str = "logit_diff"

    def needs(self, model: Any) -> Needs:
        _check_tokens(model, (self.correct, self.incorrect))
        return Needs(logits=(self.pos,))

    def __call__(self, out: Outputs) -> Tensor:
        lg = out.logits_at(self.pos)
        return (lg[:, self.correct] - lg[:, self.incorrect]).mean()


@dataclass(frozen=True, eq=False)
class LogProb(Metric):
    """Mean over the batch of ``log p(token)`` at ``pos``."""

    token: int
    pos: int = -1
    name: str = "log_prob"
    bounds: ClassVar[tuple[float | None, float | None] | None] = (None, 0.0)

    def needs(self, model: Any) -> Needs:
        _check_tokens(model, (self.token,))
        return Needs(logits=(self.pos,))

    def __call__(self, out: Outputs) -> Tensor:
        return out.logits_at(self.pos).log_softmax(-1)[:, self.token].mean()


@dataclass(frozen=True, eq=False)
class KLToClean(Metric):
    """KL(clean || patched) of the next-token distribution at ``pos`` (0 when patched == clean).

    The clean distribution is bound by the engine from the clean run (:meth:`bind`).
    """

    pos: int = -1
    clean_logprobs: Tensor | None = None
    name: str = "kl_to_clean"
    bounds: ClassVar[tuple[float | None, float | None] | None] = (0.0, None)

    def needs(self, model: Any) -> Needs:
        return Needs(logits=(self.pos,))

    def bind(self, clean: Outputs) -> Metric:
        return KLToClean(self.pos, clean.logits_at(self.pos).log_softmax(-1).detach())

    def __call__(self, out: Outputs) -> Tensor:
        if self.clean_logprobs is None:
            raise BadInputError("KLToClean needs the clean run: use it through activation_patch.")
        lp = out.logits_at(self.pos).log_softmax(-1)
        ref = self.clean_logprobs
        return (ref.exp() * (ref - lp)).sum(-1).mean()


@dataclass(frozen=True, eq=False)
class SinkScore(Metric):
    """Gu et al.'s sink score of ``key_pos`` at ``layer``: one head, or the mean over heads."""

    layer: int
    head: int | None = None
    key_pos: int = 0
    include_self: bool = True
    name: str = "sink_score"
    bounds: ClassVar[tuple[float | None, float | None] | None] = (0.0, 1.0)

    def needs(self, model: Any) -> Needs:
        _check_layer(model, self.layer, "sink_score")
        if self.head is not None and not 0 <= self.head < int(model.cfg.n_heads):
            raise BadInputError(
                f"sink_score: head {self.head} is out of range (0..{int(model.cfg.n_heads) - 1})."
            )
        return Needs(hooks=frozenset({act_name("pattern", self.layer)}))

    def __call__(self, out: Outputs) -> Tensor:
        pattern = out.act(act_name("pattern", self.layer))
        scores = _sink_score(pattern, self.key_pos, include_self=self.include_self)
        return (scores if self.head is None else scores[:, self.head]).mean()


@dataclass(frozen=True, eq=False)
class MassiveValue(Metric):
    """Mean over the batch of residual channel ``channel`` at ``pos`` after block ``layer``."""

    layer: int
    pos: int
    channel: int
    name: str = "massive_value"

    def needs(self, model: Any) -> Needs:
        _check_layer(model, self.layer, "massive_value")
        d = int(model.cfg.d_model)
        if not 0 <= self.channel < d:
            raise BadInputError(f"massive_value: channel {self.channel} is outside 0..{d - 1}.")
        return Needs(hooks=frozenset({act_name("resid_post", self.layer)}))

    def __call__(self, out: Outputs) -> Tensor:
        return out.act(act_name("resid_post", self.layer))[:, self.pos, self.channel].mean()


@dataclass(frozen=True, eq=False)
class ResidNorm(Metric):
    """Mean over the batch of the residual norm at ``pos`` after block ``layer``."""

    layer: int
    pos: int
    name: str = "resid_norm"

    def needs(self, model: Any) -> Needs:
        _check_layer(model, self.layer, "resid_norm")
        return Needs(hooks=frozenset({act_name("resid_post", self.layer)}))

    def __call__(self, out: Outputs) -> Tensor:
        return out.act(act_name("resid_post", self.layer))[:, self.pos].norm(dim=-1).mean()


def as_metric(metric: Metric | Callable[[Tensor], Tensor]) -> Metric:
    """A :class:`Metric`; plain callables on logits are wrapped as :class:`LogitsMetric`."""
    if isinstance(metric, Metric):
        return metric
    if callable(metric):
        return LogitsMetric(metric)
    raise BadInputError(
        f"metric must be a mechsink Metric or a callable on logits, got {type(metric).__name__}."
    )


def check_value(value: Any, where: str, metric: Any = None) -> Tensor:
    """The metric's value as a 0-d float tensor; a clear error (naming the metric and what it
    returned) if it is not a finite real scalar."""
    name = "the metric" if metric is None else f"the metric {getattr(metric, 'name', metric)!r}"
    if isinstance(value, bool) or not isinstance(value, (Tensor, int, float)):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise BadInputError(
            f"{name} returned {shown} (a {type(value).__name__}) {where}; it must return a "
            "scalar tensor or a number."
        )
    t = torch.as_tensor(value)
    if t.ndim != 0:
        raise BadInputError(
            f"{name} returned a tensor of shape {tuple(t.shape)} {where}; it must return a "
            "scalar (reduce over batch and positions, e.g. with .mean())."
        )
    if t.is_complex() or t.dtype == torch.bool:
        raise BadInputError(f"{name} returned a {t.dtype} scalar {where}; it must be real.")
    if not torch.isfinite(t):
        raise BadInputError(
            f"{name} returned {t.item()} {where}: it must be finite (check for log(0), "
            "division by zero or an empty selection)."
        )
    return t.detach().to(torch.float64)


def parse_metric(
    spec: str, model: Any, clean: Tensor | None = None, corrupted: Tensor | None = None
) -> Metric:
    """A metric from a CLI string: ``sink_score:LAYER[:HEAD]``, ``massive_value:L:POS:CH``,
    ``resid_norm:L:POS``, ``logit_diff:CORRECT:INCORRECT`` (token ids), ``log_prob:TOKEN``,
    ``kl``. ``logit_diff`` alone compares the clean and corrupted runs' top next tokens."""
    name, *args = spec.strip().split(":")
    if name == "logit_diff" and not args and clean is not None and corrupted is not None:
        with torch.no_grad():
            a = int(model(clean)[0, -1].argmax())
            b = int(model(corrupted)[0, -1].argmax())
        if a == b:
            raise BadInputError(
                "clean and corrupted prompts predict the same next token: give "
                "logit_diff:CORRECT_ID:INCORRECT_ID explicitly."
            )
        return LogitDiff(a, b)
    try:
        ints = [int(a) for a in args]
    except ValueError as exc:
        raise BadInputError(f"metric {spec!r}: arguments after ':' must be integers.") from exc
    makers: dict[str, Callable[..., Metric]] = {
        "sink_score": SinkScore, "massive_value": MassiveValue, "resid_norm": ResidNorm,
        "logit_diff": LogitDiff, "log_prob": LogProb, "kl": KLToClean,
    }
    if name not in makers:
        raise BadInputError(
            f"unknown metric {name!r}: choose one of {', '.join(makers)} "
            "(e.g. sink_score:5, massive_value:3:0:123, logit_diff:CORRECT_ID:INCORRECT_ID)."
        )
    try:
        return makers[name](*ints)
    except TypeError as exc:
        raise BadInputError(f"metric {spec!r}: wrong number of arguments ({exc}).") from exc


def _check_layer(model: Any, layer: int, what: str) -> None:
    n = int(model.cfg.n_layers)
    if not 0 <= layer < n:
        raise BadInputError(
            f"{what}: layer {layer} is out of range (this model has layers 0..{n - 1})."
        )


def _check_tokens(model: Any, tokens: tuple[int, ...]) -> None:
    v = int(model.cfg.d_vocab)
    for t in tokens:
        if not 0 <= t < v:
            raise BadInputError(f"token id {t} is outside the vocabulary (0..{v - 1}).")
