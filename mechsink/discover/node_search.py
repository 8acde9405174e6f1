"""Find a minimal circuit: the fewest components whose ablation removes an effect and whose
preservation (everything else ablated) keeps it.

The search is greedy over components ranked by their single-ablation effect, and model-free:
``evaluate(ablated)`` returns the metric with a set of components ablated, so the same routine
serves any model, ablation and metric (and is tested on a hand-built system).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CircuitSearch:
    """The circuit found and the two checks that define it."""

    members: tuple[Hashable, ...]
    baseline: float  # metric with nothing ablated
    without_circuit: float  # metric with the members ablated
    circuit_only: float  # metric with every other candidate ablated
    removes: bool  # without_circuit <= remove_frac * baseline
    preserves: bool  # circuit_only >= keep_frac * baseline

    def to_dict(self) -> dict[str, Any]:
        return {"members": [list(m) if isinstance(m, tuple) else m for m in self.members],
                "baseline": self.baseline, "without_circuit": self.without_circuit,
                "circuit_only": self.circuit_only, "removes": self.removes,
                "preserves": self.preserves}


def single_effects(
    components: Sequence[Hashable], evaluate: Callable[[frozenset], float]
) -> dict[Hashable, float]:
    """Drop in the metric when each component alone is ablated (baseline minus ablated)."""
    baseline = evaluate(frozenset())
    return {c: baseline - evaluate(frozenset([c])) for c in components}


def minimal_circuit(
    components: Sequence[Hashable],
    evaluate: Callable[[frozenset], float],
    *,
    effects: dict[Hashable, float] | None = None,
    remove_frac: float = 0.5,
    keep_frac: float = 0.8,
) -> CircuitSearch:
    """Add components in order of single-ablation effect until (1) ablating the members brings
    the metric to ``remove_frac`` of its baseline and (2) ablating every *other* candidate keeps
    at least ``keep_frac`` of it; stop as soon as both hold (or the candidates run out)."""
    baseline = evaluate(frozenset())
    if baseline <= 0:  # nothing to explain: report an empty circuit, neither check passed
        return CircuitSearch((), baseline, baseline, baseline, removes=False, preserves=False)
    effects = effects if effects is not None else single_effects(components, evaluate)
    order = sorted(components, key=lambda c: -effects[c])
    members: list[Hashable] = []
    without = only = baseline
    for component in order:
        members.append(component)
        without = evaluate(frozenset(members))
        if without > remove_frac * baseline:
            continue
        only = evaluate(frozenset(c for c in components if c not in members))
        if only >= keep_frac * baseline:
            break
    return CircuitSearch(tuple(members), baseline, without, only,
                         removes=without <= remove_frac * baseline,
                         preserves=only >= keep_frac * baseline)
