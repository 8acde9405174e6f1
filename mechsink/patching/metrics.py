"""Patching metrics: scalars computed from a (patched) run's logits and/or activations.

A metric declares what it reads (:class:`Needs`: hook names, and which logit positions), so the
engine caches only those, stops the forward after the last hook it reads, and unembeds only the
positions a logit metric looks at. Any plain callable ``fn(logits) -> scalar`` (what
``transformer_lens.patching`` takes) is wrapped as :class:`LogitsMetric` and sees the full logits.
Metrics average over the input batch, so every value is one scalar per patch. The built-in
metrics reduce in float32 at least whatever the model's dtype (their slice is cast first, see
:mod:`mechsink.measure.wide`), and a callable on logits receives them in float32 at least.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int
from torch import Tensor

from mechsink.errors import BadInputError
from mechsink.measure.sinks import sink_score as _sink_score
from mechsink.measure.wide import wide
from mechsink.model import act_name
from mechsink.model.precision import overflow_advice

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

    @property
    def batch(self) -> int | None:
        """The number of prompts (None when nothing was captured)."""
        for t in (self.logits, *self.acts.values()):
            if t is not None:
                return int(t.shape[0])
        return None

    def logits_at(self, pos: int) -> Float[Tensor, "batch vocab"]:
        """Logits at one position (negative counts from the end)."""
        if self.logits is None:
            raise RuntimeError("this metric did not declare that it reads logits")
        p = check_position(pos, self.seq_len, "the metric")
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

    def bind_runs(self, clean: Outputs, corrupted: Outputs | None) -> Metric:
        """A copy that knows both recorded runs (``corrupted`` None under an ablation): what
        patching calls once, on the runs it records anyway, so a metric read off them (a bare
        ``logit_diff``'s predicted tokens) costs no forward of its own. Default: :meth:`bind`."""
        return self.bind(clean)

    def check_seq_len(self, seq_len: int) -> None:
        """Refuse, before any forward, a position the metric reads outside a prompt of
        ``seq_len`` tokens. Default: none to check (logit positions are checked from
        :meth:`needs`; activation metrics with a position override this)."""
        return None

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

    def bind_runs(self, clean: Outputs, corrupted: Outputs | None) -> Metric:
        return Combination(tuple((w, m.bind_runs(clean, corrupted)) for w, m in self.terms))

    def check_seq_len(self, seq_len: int) -> None:
        for _, m in self.terms:
            m.check_seq_len(seq_len)


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
        return self.fn(None if out.logits is None else wide(out.logits))


def _ids(value: Any, what: str) -> int | Tensor:
    """One token id (an int) or one id per prompt (a 1-D long tensor)."""
    if isinstance(value, bool):
        raise BadInputError(f"{what} must be a token id or one id per prompt, got {value!r}.")
    if isinstance(value, int):
        return value
    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError) as exc:
        raise BadInputError(f"{what} must be a token id or one id per prompt, got "
                            f"{type(value).__name__}.") from exc
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise BadInputError(f"{what} must hold integer token ids, got dtype {t.dtype}.")
    if t.ndim == 0:
        return int(t)
    if t.ndim != 1 or t.numel() == 0:
        raise BadInputError(f"{what} must be one id per prompt (a 1-D tensor [batch]), got "
                            f"shape {tuple(t.shape)}.")
    return t.long()


def last_real_positions(attention_mask: Any) -> Int[Tensor, " batch"]:
    """Per prompt, the position of its last real token in a right-padded batch (mask 1 on real
    tokens, 0 on the pads after them). Left padding is refused: causal attention would let the
    real tokens read the pads in front of them, so the run would not equal the unpadded one."""
    mask = torch.as_tensor(attention_mask)
    if mask.ndim != 2:
        raise BadInputError(f"attention_mask must be [batch, pos], got shape {tuple(mask.shape)}.")
    real = mask != 0
    if not bool(real[:, 0].all()):
        row = int((~real[:, 0]).nonzero()[0])
        raise BadInputError(f"attention_mask row {row} starts with padding: pad on the right "
                            "(tokenizer.padding_side = 'right', or mechsink.patching.pad_prompts).")
    if bool((real[:, 1:] & ~real[:, :-1]).any()):
        row = int((real[:, 1:] & ~real[:, :-1]).any(-1).nonzero()[0])
        raise BadInputError(f"attention_mask row {row} has a real token after a pad: pad on "
                            "the right only (mechsink.patching.pad_prompts).")
    return real.long().sum(-1) - 1


def _positions(metric: str, position: Any, attention_mask: Any, old: dict[str, Any]
               ) -> int | Tensor:
    """The read position: one for all prompts (an int, negative from the end), one per
    prompt (a 1-D tensor), or each prompt's last real token (from ``attention_mask``)."""
    _no_old(metric, old)
    if attention_mask is not None:
        if position is not None:
            raise BadInputError(f"{metric}: give position= or attention_mask=, not both (the "
                                "mask sets each prompt's last real token as its position).")
        return last_real_positions(attention_mask)
    if position is None:
        return -1
    return _ids(position, f"{metric}: position")


_LOGIT_DIFF_NEEDS_PAIR = ("metric 'logit_diff' without token ids needs the clean and corrupted "
                          "prompts: give logit_diff:CORRECT_ID:INCORRECT_ID.")


def check_without_corrupted(metric: Metric) -> None:
    """Refuse, before any work, a metric that reads the corrupted run's prediction (a bare
    ``logit_diff``) where the corruption is an ablation: there is no corrupted prompt."""
    parts = [m for _, m in metric.terms] if isinstance(metric, Combination) else [metric]
    if any(isinstance(m, LogitDiff) and (m.correct is None or m.incorrect is None)
           for m in parts):
        raise BadInputError(_LOGIT_DIFF_NEEDS_PAIR)


def _positions_needed(position: int | Tensor) -> tuple[int, ...]:
    if isinstance(position, int):
        return (position,)
    return tuple(sorted({int(p) for p in position}))


def _read_logits(out: Outputs, position: int | Tensor, metric: str) -> Float[Tensor, "batch vocab"]:
    """The logits each prompt's metric reads: at one position, or at its own position."""
    if isinstance(position, int):
        return wide(out.logits_at(position))
    rows = [out.logits_at(int(p))[i] for i, p in enumerate(_per_prompt(position, out, metric))]
    return wide(torch.stack(rows))


def _per_prompt(values: Tensor, out: Outputs, what: str) -> Tensor:
    batch = out.batch
    if batch is not None and values.shape[0] != batch:
        raise BadInputError(f"{what}: {values.shape[0]} entries (one per prompt) for a batch of "
                            f"{batch} prompts.")
    return values


def _at_ids(lg: Float[Tensor, "batch vocab"], ids: int | Tensor, what: str
            ) -> Float[Tensor, " batch"]:
    if isinstance(ids, int):
        return lg[:, ids]
    if ids.shape[0] != lg.shape[0]:
        raise BadInputError(f"{what}: {ids.shape[0]} token ids (one per prompt) for a batch of "
                            f"{lg.shape[0]} prompts.")
    return lg.gather(1, ids.to(lg.device).unsqueeze(1)).squeeze(1)


def _shown(x: int | Tensor) -> str:
    if isinstance(x, int):
        return str(x)
    head = ", ".join(str(int(v)) for v in x[:4])
    return f"[{head}{', ...' if x.numel() > 4 else ''}] ({x.numel()} prompts)"


class LogitDiff(Metric):
    """Mean over the batch of ``logit[correct] - logit[incorrect]`` at ``position``.

    ``correct`` / ``incorrect``: one token id, or one per prompt (IOI-style datasets). The
    position: one for every prompt (default -1, the last), one per prompt, or, with the
    ``attention_mask`` of a right-padded batch, each prompt's last real token.
    :meth:`predicted` takes both ids from the clean and corrupted runs instead.
    """

    correct: int | Tensor | None  # None: predicted, set when patching binds the metric
    incorrect: int | Tensor | None

    def __init__(self, correct: Any, incorrect: Any, position: Any = None, *,
                 attention_mask: Any = None, name: str = "logit_diff", **old: Any) -> None:
        self.position = _positions("LogitDiff", position, attention_mask, old)
        self.correct = _ids(correct, "LogitDiff: correct")
        self.incorrect = _ids(incorrect, "LogitDiff: incorrect")
        self.name = name

    @classmethod
    def predicted(cls, *, name: str = "logit_diff") -> LogitDiff:
        """The clean prompt's top next token against the corrupted prompt's (first prompt, last
        position), both read off the runs patching records anyway when it binds the metric
        (:meth:`bind_runs`): what a bare ``"logit_diff"`` means, at no forward of its own."""
        metric = cls(0, 0, name=name)
        metric.correct = metric.incorrect = None
        return metric

    def __repr__(self) -> str:
        if self.correct is None or self.incorrect is None:
            return "LogitDiff.predicted()"
        return (f"LogitDiff(correct={_shown(self.correct)}, incorrect={_shown(self.incorrect)}, "
                f"position={_shown(self.position)})")

    def needs(self, model: Any) -> Needs:
        _check_tokens(model, tuple(t for t in (self.correct, self.incorrect) if t is not None))
        return Needs(logits=_positions_needed(self.position))

    def bind_runs(self, clean: Outputs, corrupted: Outputs | None) -> Metric:
        if self.correct is not None and self.incorrect is not None:
            return self
        if corrupted is None:
            raise BadInputError(_LOGIT_DIFF_NEEDS_PAIR)
        a = int(clean.logits_at(-1)[0].argmax())
        b = int(corrupted.logits_at(-1)[0].argmax())
        if a == b:
            raise BadInputError(
                "clean and corrupted prompts predict the same next token: give "
                "logit_diff:CORRECT_ID:INCORRECT_ID explicitly."
            )
        return LogitDiff(a, b, name=self.name)

    def __call__(self, out: Outputs) -> Tensor:
        if self.correct is None or self.incorrect is None:
            raise BadInputError("LogitDiff.predicted() reads its tokens off the clean and "
                                "corrupted runs: use it through activation_patch.")
        lg = _read_logits(out, self.position, "LogitDiff: position")
        return (_at_ids(lg, self.correct, "LogitDiff: correct")
                - _at_ids(lg, self.incorrect, "LogitDiff: incorrect")).mean()


class LogProb(Metric):
    """Mean over the batch of ``log p(token)`` at ``position`` (token and position: one for all
    prompts or one per prompt; ``attention_mask``: each prompt's last real token)."""

    bounds: ClassVar[tuple[float | None, float | None] | None] = (None, 0.0)

    def __init__(self, token: Any, position: Any = None, *, attention_mask: Any = None,
                 name: str = "log_prob", **old: Any) -> None:
        self.position = _positions("LogProb", position, attention_mask, old)
        self.token = _ids(token, "LogProb: token")
        self.name = name

    def __repr__(self) -> str:
        return f"LogProb(token={_shown(self.token)}, position={_shown(self.position)})"

    def needs(self, model: Any) -> Needs:
        _check_tokens(model, (self.token,))
        return Needs(logits=_positions_needed(self.position))

    def __call__(self, out: Outputs) -> Tensor:
        lp = _read_logits(out, self.position, "LogProb: position").log_softmax(-1)
        return _at_ids(lp, self.token, "LogProb: token").mean()


class KLToClean(Metric):
    """KL(clean || patched) of the next-token distribution at ``position`` (0 when patched ==
    clean; one position, one per prompt, or the last real token of ``attention_mask``).

    The clean distribution is bound by the engine from the clean run (:meth:`bind`).
    """

    bounds: ClassVar[tuple[float | None, float | None] | None] = (0.0, None)

    def __init__(self, position: Any = None, clean_logprobs: Tensor | None = None, *,
                 attention_mask: Any = None, name: str = "kl_to_clean", **old: Any) -> None:
        self.position = _positions("KLToClean", position, attention_mask, old)
        self.clean_logprobs = clean_logprobs
        self.name = name

    def __repr__(self) -> str:
        return f"KLToClean(position={_shown(self.position)})"

    def needs(self, model: Any) -> Needs:
        return Needs(logits=_positions_needed(self.position))

    def bind(self, clean: Outputs) -> Metric:
        ref = _read_logits(clean, self.position, "KLToClean: position").log_softmax(-1)
        return KLToClean(self.position, ref.detach(), name=self.name)

    def __call__(self, out: Outputs) -> Tensor:
        if self.clean_logprobs is None:
            raise BadInputError("KLToClean needs the clean run: use it through activation_patch.")
        lp = _read_logits(out, self.position, "KLToClean: position").log_softmax(-1)
        ref = self.clean_logprobs
        return (ref.exp() * (ref - lp)).sum(-1).mean()


@dataclass(frozen=True, eq=False)
class SinkScore(Metric):
    """Gu et al.'s sink score of key ``position`` (default 0, the first token) at ``layer``: one
    head, or the mean over heads."""

    layer: int
    head: int | None = None
    position: int = 0
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
        scores = _sink_score(pattern, self.position, include_self=self.include_self)
        return (scores if self.head is None else scores[:, self.head]).mean()


def _no_old(metric: str, old: dict[str, Any]) -> None:
    if "pos" in old:
        raise BadInputError(f"{metric}: pos= is spelled position=; see docs/concepts/names.md.")
    if old:
        raise TypeError(f"{metric}() got unexpected keyword arguments {sorted(old)}.")


class MassiveValue(Metric):
    """Mean over the batch of residual channel ``channel`` at ``position`` after block
    ``layer`` (a massive activation's value, Sun et al. 2024)."""

    def __init__(self, layer: int, position: int | None = None, channel: int | None = None, *,
                 name: str = "massive_value", **old: Any) -> None:
        _no_old("MassiveValue", old)
        if position is None or channel is None:
            raise TypeError("MassiveValue(layer, position, channel): all three are required.")
        self.layer, self.position, self.channel, self.name = layer, position, channel, name

    def __repr__(self) -> str:
        return (f"MassiveValue(layer={self.layer}, position={self.position}, "
                f"channel={self.channel})")

    def check_seq_len(self, seq_len: int) -> None:
        check_position(self.position, seq_len, "massive_value")

    def needs(self, model: Any) -> Needs:
        _check_layer(model, self.layer, "massive_value")
        d = int(model.cfg.d_model)
        if not 0 <= self.channel < d:
            raise BadInputError(f"massive_value: channel {self.channel} is outside 0..{d - 1}.")
        return Needs(hooks=frozenset({act_name("resid_post", self.layer)}))

    def __call__(self, out: Outputs) -> Tensor:
        p = check_position(self.position, out.seq_len, "massive_value")
        return wide(out.act(act_name("resid_post", self.layer))[:, p, self.channel]).mean()


class ResidNorm(Metric):
    """Mean over the batch of the residual norm at ``position`` after block ``layer``."""

    def __init__(self, layer: int, position: int | None = None, *, name: str = "resid_norm",
                 **old: Any) -> None:
        _no_old("ResidNorm", old)
        if position is None:
            raise TypeError("ResidNorm(layer, position): both are required.")
        self.layer, self.position, self.name = layer, position, name

    def __repr__(self) -> str:
        return f"ResidNorm(layer={self.layer}, position={self.position})"

    def check_seq_len(self, seq_len: int) -> None:
        check_position(self.position, seq_len, "resid_norm")

    def needs(self, model: Any) -> Needs:
        _check_layer(model, self.layer, "resid_norm")
        return Needs(hooks=frozenset({act_name("resid_post", self.layer)}))

    def __call__(self, out: Outputs) -> Tensor:
        p = check_position(self.position, out.seq_len, "resid_norm")
        return wide(out.act(act_name("resid_post", self.layer))[:, p]).norm(dim=-1).mean()


def check_position(position: int, seq_len: int, what: str) -> int:
    """``position`` made non-negative (negative counts from the end); a one-line error when it
    lies outside a sequence of ``seq_len`` tokens."""
    p = position + seq_len if position < 0 else position
    if not 0 <= p < seq_len:
        raise BadInputError(f"{what}: position {position} is outside the {seq_len} tokens of the "
                            f"prompt (0..{seq_len - 1}, or -1 for the last).")
    return p


def as_metric(metric: Metric | Callable[[Tensor], Tensor] | str, model: Any = None,
              clean: Tensor | None = None, corrupted: Tensor | None = None) -> Metric:
    """A :class:`Metric`: plain callables on logits are wrapped as :class:`LogitsMetric`, and
    strings are read by :func:`parse_metric` (the CLI's forms; they need the ``model``)."""
    if isinstance(metric, Metric):
        return metric
    if isinstance(metric, str):
        return parse_metric(metric, model, clean, corrupted)
    if callable(metric):
        return LogitsMetric(metric)
    raise BadInputError(
        f"metric must be a mechsink Metric, a metric string such as 'sink_score:5' or a "
        f"callable on logits, got {type(metric).__name__}."
    )


def check_value(value: Any, where: str, metric: Any = None,
                dtype: torch.dtype | None = None) -> Tensor:
    """The metric's value as a 0-d float tensor; a clear error (naming the metric and what it
    returned) if it is not a finite real scalar. ``dtype``: the model's (a metric reduces in
    float32, so its value's own dtype does not say that the model ran in half precision)."""
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
            "division by zero or an empty selection)." + overflow_advice(dtype or t.dtype)
        )
    return t.detach().to(torch.float64)


#: the metric strings: name -> (maker, the names of its integer arguments, how many may be left out)
METRIC_FORMS: dict[str, tuple[Callable[..., Metric], tuple[str, ...], int]] = {
    "sink_score": (SinkScore, ("LAYER", "HEAD"), 1),
    "massive_value": (MassiveValue, ("LAYER", "POS", "CH"), 0),
    "resid_norm": (ResidNorm, ("LAYER", "POS"), 0),
    "logit_diff": (LogitDiff, ("CORRECT", "INCORRECT"), 0),
    "log_prob": (LogProb, ("TOKEN",), 0),
    "kl": (KLToClean, (), 0),
}


def metric_usage(name: str) -> str:
    """The form of one metric string, e.g. ``massive_value:LAYER:POS:CH``."""
    _, args, optional = METRIC_FORMS[name]
    shown = [a if i < len(args) - optional else f"[{a}]" for i, a in enumerate(args)]
    return ":".join([name, *shown])


def parse_metric(
    spec: str, model: Any = None, clean: Tensor | None = None, corrupted: Tensor | None = None
) -> Metric:
    """A metric from a string, the one parser of the CLI and the Python API (``metric=`` of
    :func:`~mechsink.patching.activation_patch`): ``sink_score:LAYER[:HEAD]``,
    ``massive_value:LAYER:POS:CH``, ``resid_norm:LAYER:POS``, ``logit_diff:CORRECT:INCORRECT``
    (token ids), ``log_prob:TOKEN``, ``kl``. ``logit_diff`` alone compares the clean and
    corrupted runs' top next tokens (:meth:`LogitDiff.predicted`: read off the runs patching
    records, so parsing runs no forward). Without a model only the form is checked; with one,
    the layers, heads, channels and token ids, and with ``clean`` tokens the positions too (a
    one-line :class:`~mechsink.errors.BadInputError`, before any forward)."""
    if not isinstance(spec, str):
        raise BadInputError(f"a metric string must be a str, got {type(spec).__name__}.")
    name, *args = spec.strip().split(":")
    if name not in METRIC_FORMS:
        raise BadInputError(
            f"unknown metric {name!r}: choose one of {', '.join(METRIC_FORMS)} "
            "(e.g. sink_score:5, massive_value:3:0:123, logit_diff:CORRECT_ID:INCORRECT_ID)."
        )
    maker, names, optional = METRIC_FORMS[name]
    if name == "logit_diff" and not args:
        if clean is not None and corrupted is None:  # an ablation: no corrupted prediction
            raise BadInputError(_LOGIT_DIFF_NEEDS_PAIR)
        return LogitDiff.predicted()
    if not len(names) - optional <= len(args) <= len(names):
        raise BadInputError(f"metric {spec!r}: expected {metric_usage(name)} "
                            f"({len(args)} argument{'s' if len(args) != 1 else ''} given).")
    try:
        ints = [int(a) for a in args]
    except ValueError as exc:
        raise BadInputError(f"metric {spec!r}: the arguments of {metric_usage(name)} must be "
                            "integers.") from exc
    metric = maker(*ints)
    if model is not None:
        metric.needs(model)  # layers, heads, channels, token ids
        if clean is not None and name in ("massive_value", "resid_norm"):
            check_position(ints[1], int(clean.shape[-1]), f"metric {spec!r}")
    return metric


def _check_layer(model: Any, layer: int, what: str) -> None:
    n = int(model.cfg.n_layers)
    if not 0 <= layer < n:
        raise BadInputError(
            f"{what}: layer {layer} is out of range (this model has layers 0..{n - 1})."
        )


def _check_tokens(model: Any, tokens: tuple[int | Tensor, ...]) -> None:
    v = int(model.cfg.d_vocab)
    for t in tokens:
        for x in ([t] if isinstance(t, int) else [int(t.min()), int(t.max())]):
            if not 0 <= x < v:
                raise BadInputError(f"token id {x} is outside the vocabulary (0..{v - 1}).")
