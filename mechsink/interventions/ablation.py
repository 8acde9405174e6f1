"""One ablation vocabulary for activation patching, path patching and interventions.

An ablation says what value replaces an activation that is "switched off". Four kinds:

- ``"zero"``: zeros.
- ``"batch_mean"``: at each position, the mean over the sequences of a batch (the reference
  batch, or the run's own batch), as in Wang et al. (2022) "Interpretability in the Wild".
- ``"position_mean"``: within each sequence, the mean over that sequence's positions that are
  *not* ablated (ablating position 0 gives the mean of positions 1..T-1). It asks "what does
  this component's output at these positions do", with "an ordinary position's value" as the
  baseline; no reference data set is needed (the P0-sink question, where no corrupted text
  makes position 0 ordinary).
- ``"resample"``: the activation from another prompt: sequence ``i`` takes reference sequence
  ``rows[i]``, drawn uniformly with a seeded generator (Chan et al. 2022, "Causal
  Scrubbing"'s resampling ablation).

Activations are laid out ``[batch, pos, ...]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from mechsink.errors import BadInputError

AblationKind = Literal["zero", "batch_mean", "position_mean", "resample"]
KINDS: tuple[str, ...] = ("zero", "batch_mean", "position_mean", "resample")


@dataclass(frozen=True)
class Ablation:
    """What replaces an ablated activation: ``kind`` (see the module doc) and the resample seed."""

    kind: AblationKind
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BadInputError(
                f"unknown ablation {self.kind!r}: choose one of {', '.join(KINDS)}."
            )

    def __str__(self) -> str:
        return self.kind if self.kind != "resample" else f"resample(seed={self.seed})"

    def values(
        self,
        act: Float[Tensor, "batch pos ..."],
        ablated: Bool[Tensor, " pos"] | None = None,
        *,
        reference: Float[Tensor, "ref ..."] | None = None,
    ) -> Float[Tensor, "batch pos ..."]:
        """The replacement for every entry of ``act`` (use it where the ablation applies).

        ``ablated`` marks the ablated positions (needed by ``position_mean`` only; None = all).
        ``reference`` is the batch ``batch_mean`` averages over and ``resample`` draws from
        (default: ``act`` itself); it must have ``act``'s positions.
        """
        ref = act if reference is None else reference
        if ref.shape[1:] != act.shape[1:]:
            raise BadInputError(
                f"the reference activations {tuple(ref.shape[1:])} do not match the run's "
                f"{tuple(act.shape[1:])} (a different number of tokens?): pass a reference "
                "batch with the prompts' length."
            )
        if self.kind == "zero":
            return torch.zeros_like(act)
        if self.kind == "batch_mean":
            return ref.mean(0, keepdim=True).expand_as(act).to(act.dtype)
        if self.kind == "resample":
            g = torch.Generator().manual_seed(self.seed)
            rows = torch.randint(ref.shape[0], (act.shape[0],), generator=g)
            return ref[rows.to(ref.device)].to(act.dtype)
        n_pos = act.shape[1]
        if ablated is None:
            ablated = torch.ones(n_pos, dtype=torch.bool)
        others = ~ablated.to(act.device)
        if not bool(others.any()):
            raise BadInputError(
                "position_mean needs at least one position that is not ablated (it is the mean "
                "over the others): ablate fewer positions, or use zero or batch_mean."
            )
        return act[:, others].mean(1, keepdim=True).expand_as(act)


def as_ablation(spec: str | Ablation | None, *, seed: int = 0) -> Ablation | None:
    """An :class:`Ablation` from one of :data:`KINDS`' names, or None for None."""
    if spec is None or isinstance(spec, Ablation):
        return spec
    if not isinstance(spec, str):
        raise BadInputError(
            f"ablation must be a name or an Ablation, got {type(spec).__name__}."
        )
    if spec not in KINDS:
        hint = (" (a mean over the batch is batch_mean, over the other positions "
                "position_mean)" if spec == "mean" else "")
        raise BadInputError(
            f"unknown ablation {spec!r}: choose one of {', '.join(KINDS)} (or None){hint}."
        )
    return Ablation(spec, seed)  # type: ignore[arg-type]


__all__ = ["KINDS", "Ablation", "AblationKind", "as_ablation"]
