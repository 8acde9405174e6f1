"""EAP-IG (Hanna, Pezzelle and Belinkov 2024, "Have Faith in Faithfulness: Going Beyond
Circuit Overlap When Finding Model Mechanisms"): the gradient averaged over ``steps`` points
between clean and corrupted (midpoint rule), times each sender's corrupted-minus-clean write.

Three paths between clean and corrupted, ``ig=``:

- ``"inputs"`` (Hanna et al.'s EAP-IG-inputs): the input embedding moves a fraction ``alpha``
  of the way to its corrupted value, every receiver's gradient is taken there. One
  forward/backward per step for the whole graph. The reference implementation takes its
  points at one end of each step (:func:`reference_alphas`); the midpoints are closer to the
  integral at the same cost, and ``convention="reference"`` reproduces the reference's.
- ``"activations"`` (IG on activations: Marks et al. 2024, "Sparse Feature Circuits"): one
  *sender group* at a time (the embedding, a layer's heads, a layer's MLP with its neuron
  senders) has its writes moved a fraction ``alpha`` to corrupted, everything downstream
  computed live, and the edges out of that group are scored with the gradients of that run.
  The scores of a group's edges add up to the effect of corrupting the group (as ``steps``
  grows). One forward/backward per step and group, each from the group's block on, and only
  one group's run in memory at a time. Hanna et al.'s EAP-IG-activations moves the same
  groups but scores every edge with the gradient averaged over all groups' runs, whose sums
  do not add up so: ``convention="reference"`` computes that.
- ``"coefficients"``: every edge coefficient at ``alpha`` at once (each receiver reads its
  senders ``alpha`` corrupted), the gradient with respect to the coefficients; all edges add
  up to ``m(corrupted) - m(clean)``. It keeps every sender's write at every receiver slot for
  the backward pass, so its memory grows with the graph: for small graphs, and for
  ``edges=`` (those edges alone interpolated: IG along one edge is its exact patch).

The default is ``"activations"``: on the saturated sink metrics (the massive channel at
position 0 of SmolLM2-135M and Gemma-3-270M, position_mean) it agreed best with exact edge
patching on the top 200 edges (Pearson 0.60 and 0.67 against 0.26 and 0.45 on inputs;
Spearman 0.66 and 0.91 against 0.64 and 0.63), already at 5 steps, for about 2-3x the time of
the inputs path (``benchmarks/discover_agreement.py``). Moving the embedding alone leaves a
saturated block far from its corrupted state along most of the path; moving each group's own
writes does not.

The steps themselves (they need torch) are in :mod:`mechsink.discover.integrated_gradients`;
this module holds the method's options and checks, which the command line reads at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mechsink.discover.methods import EDGES, QK_FIX, VERIFY, Option, register
from mechsink.errors import BadInputError
from mechsink.lazy import lazy_names

if TYPE_CHECKING:
    from mechsink.discover.graph_run import GraphRun
    from mechsink.discover.scores import EdgeScores

#: the interpolation paths ``ig=`` takes
PATHS = ("inputs", "activations", "coefficients")
#: how the steps are placed and summed, ``convention=``: mechsink's (the midpoint rule; IG on
#: activations scores each group's edges from that group's own runs) or the reference
#: implementation's, to reproduce numbers published with it (see :func:`reference_alphas`)
CONVENTIONS = ("mechsink", "reference")

STEPS = Option("steps", int, 5, "EAP-IG interpolation steps", minimum=1)
IG = Option("ig", str, "activations", "EAP-IG's path from clean to corrupted: inputs (the "
            "embedding), activations (one sender group at a time) or coefficients (every edge "
            "at once; memory grows with the graph)", choices=PATHS)
CONVENTION = Option("convention", str, "mechsink", "EAP-IG's step points and sums: mechsink "
                    "(midpoints; a group's edges from its own runs) or reference (as the "
                    "reference EAP-IG implementation, to reproduce published numbers; add "
                    "--no-qk-fix)", choices=CONVENTIONS)

#: the public helpers of the steps (:mod:`mechsink.discover.integrated_gradients`), readable
#: here too
_STEP_HELPERS = ("sender_groups", "graph_group_grads", "group_rows")


def reference_alphas(ig: str, steps: int) -> list[float]:
    """The fractions of the way to corrupted at which the reference EAP-IG implementation
    (Hanna et al. 2024's ``eap`` package, as used by MIB: Mueller et al. 2025, "MIB: A
    Mechanistic Interpretability Benchmark") takes its gradients: on inputs the points
    ``corrupted + k/steps (clean - corrupted)`` for ``k = 0..steps-1`` (the corrupted end in,
    the clean end out), on activations ``k/steps clean + (1 - k/steps) corrupted`` for ``k =
    1..steps`` (the clean end in, the corrupted end out). mechsink's own are the midpoints
    ``(k + 0.5) / steps``, closer to the integral at the same cost."""
    ks = range(steps) if ig == "inputs" else range(1, steps + 1)
    return [1.0 - k / steps for k in ks]


@register("eap-ig", options=(STEPS, IG, QK_FIX, VERIFY, EDGES, CONVENTION))
def eap_ig(run: GraphRun, *, steps: int = 5, ig: str = "activations", qk_fix: bool = True,
           verify: int = 20, edges: Sequence[int] | None = None,
           convention: str = "mechsink") -> EdgeScores:
    """EAP-IG with ``steps`` interpolation points (midpoint rule), on ``"inputs"``,
    ``"activations"`` or ``"coefficients"`` (see the module doc). ``edges`` (coefficients
    only): interpolate these edges alone, the others stay clean. ``qk_fix`` replaces the
    scores of edges into queries and keys by AtP*'s estimate at the clean run (one more
    backward pass), as :func:`~mechsink.discover.methods.eap.eap` does; on by default, as in
    :func:`~mechsink.discover.pipeline.discover` and ``mechsink discover``.

    ``convention="reference"`` computes what the reference implementation does (inputs and
    activations; pass ``qk_fix=False`` too, it has no QK fix): its step points
    (:func:`reference_alphas`) and, on activations, every edge scored with the gradient
    averaged over *every* group's runs (each a whole-model run moving one group), where
    mechsink scores a group's edges from that group's own runs only (which makes a group's
    scores add up to the effect of corrupting it; the reference's do not)."""
    from mechsink.discover import integrated_gradients as igs
    from mechsink.discover import scores

    _check(steps, ig, edges, convention)
    scores.check_verify(verify)
    reference = convention == "reference"
    alphas = (reference_alphas(ig, steps) if reference
              else [(k + 0.5) / steps for k in range(steps)])
    if ig == "inputs":
        total = igs.stacked_steps(run, alphas)
    elif ig == "activations" and reference:
        total = igs.reference_group_steps(run, alphas)
    elif ig == "activations":
        total = igs.group_steps(run, alphas)
    else:
        total = igs.coefficient_steps(run, alphas, edges)
    values = scores.on_edges(run, total / steps)
    grads_clean = scores.clean_gradients(run) if qk_fix else None
    return scores.finish(run, values, "eap-ig", {"steps": steps, "ig": ig,
                                                 "convention": convention},
                         qk_fix, verify, grads_clean)


def _check(steps: Any, ig: Any, edges: Sequence[int] | None, convention: Any) -> None:
    """EAP-IG's arguments, before any forward (a clear error naming the bad one)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise BadInputError(f"steps must be a positive integer, got {steps!r}.")
    if ig not in PATHS:
        raise BadInputError(f"ig must be one of {', '.join(map(repr, PATHS))}, got {ig!r}.")
    if edges is not None and ig != "coefficients":
        raise BadInputError("edges= restricts the interpolated edges: use ig='coefficients'.")
    if convention not in CONVENTIONS or (convention == "reference" and ig == "coefficients"):
        raise BadInputError(f"convention must be 'mechsink' or 'reference' (the latter on "
                            f"ig='inputs' or 'activations'), got {convention!r} with ig={ig!r}.")


#: the steps' public helpers, readable here on first use (they import torch)
__getattr__, __dir__ = lazy_names(
    __name__, dict.fromkeys(_STEP_HELPERS, "mechsink.discover.integrated_gradients"), globals())
