"""The minimal-circuit search recovers a planted circuit and ignores decoys."""

from __future__ import annotations

from mechsink.discover.node_search import minimal_circuit, single_effects


def planted(ablated: frozenset) -> float:
    """A hand-built system: the effect needs A and B (an AND circuit, 1.0); C alone gives a
    small bump that A and B do not need (a decoy); D does nothing."""
    value = 1.0 if not ({"A", "B"} & ablated) else 0.1
    return value + (0.05 if "C" not in ablated else 0.0)


def test_recovers_the_planted_circuit_and_not_the_decoy():
    components = ["D", "C", "B", "A"]
    effects = single_effects(components, planted)
    assert effects["A"] > effects["C"] > effects["D"] == 0
    found = minimal_circuit(components, planted, effects=effects)
    assert found.removes and found.preserves
    assert set(found.members) == {"A", "B"}  # either alone removes it; both are needed to keep it
    assert found.circuit_only == 1.0  # the decoy C is not needed: only its small bump is lost


def test_needs_every_member_when_effects_are_additive():
    weights = {"A": 0.4, "B": 0.35, "C": 0.2, "D": 0.05}

    def additive(ablated: frozenset) -> float:
        return sum(w for c, w in weights.items() if c not in ablated)

    found = minimal_circuit(list(weights), additive)
    # A and B remove it (1.0 -> 0.25); keeping only them leaves 0.75 < 0.8, so C joins
    assert found.members == ("A", "B", "C") and found.removes and found.preserves
    assert found.circuit_only == 0.95


def test_no_effect_means_no_circuit():
    found = minimal_circuit(["A", "B"], lambda ablated: 0.0)
    assert found.members == () and not found.removes and not found.preserves
