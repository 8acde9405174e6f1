"""EAP-IG (Hanna, Pezzelle and Belinkov 2024, "Have Faith in Faithfulness: Going Beyond
Circuit Overlap When Finding Model Mechanisms"): the gradient averaged over ``steps`` points
between clean and corrupted (midpoint rule).

``ig="inputs"`` moves the input embedding (every receiver reads ``embed`` a fraction ``alpha``
corrupted) and multiplies by the clean-to-corrupted difference; ``ig="activations"`` moves
every edge at once (the edge coefficients all at ``alpha``) and integrates the gradient of the
metric with respect to the edge coefficients, so the scores add up to ``m(corrupted) -
m(clean)`` as ``steps`` grows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mechsink.discover import plain_grads, scores
from mechsink.discover.methods import register
from mechsink.discover.run import GraphRun
from mechsink.discover.scores import EdgeScores
from mechsink.errors import BadInputError


@register("eap-ig")
def eap_ig(run: GraphRun, *, steps: int = 5, ig: str = "inputs", qk_fix: bool = True,
           verify: int = 20, edges: Sequence[int] | None = None) -> EdgeScores:
    """EAP-IG with ``steps`` interpolation points (midpoint rule), on ``"inputs"`` or
    ``"activations"`` (see the module doc). ``edges`` (activations only): interpolate these
    edges alone, the others stay clean (IG along one edge is its exact patch). ``qk_fix``
    replaces the scores of edges into queries and keys by AtP*'s estimate at the clean run
    (one more backward pass), as :func:`~mechsink.discover.methods.eap.eap` does; on by
    default, as in :func:`~mechsink.discover.pipeline.discover` and ``mechsink discover``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise BadInputError(f"steps must be a positive integer, got {steps!r}.")
    if ig not in ("inputs", "activations"):
        raise BadInputError(f"ig must be 'inputs' or 'activations', got {ig!r}.")
    if edges is not None and ig != "activations":
        raise BadInputError("edges= restricts the interpolated edges: use ig='activations'.")
    scores.check_verify(verify)
    g = run.graph
    if edges is None:
        path = g.valid.clone().double() if ig == "activations" else torch.zeros(
            len(g.senders), len(g.receivers), dtype=torch.float64)
        if ig == "inputs":
            path[0] = g.valid[0].double()  # every edge out of the embedding
    else:
        sel = torch.zeros(g.n_edges, dtype=torch.float64)
        sel[torch.as_tensor(list(edges), dtype=torch.long)] = 1.0
        path = g.dense(sel)
    alphas = [(k + 0.5) / steps for k in range(steps)]
    if ig == "inputs":
        total = _stacked_steps(run, path, alphas)
    else:
        total = torch.zeros(len(g.senders), len(g.receivers), dtype=torch.float64)
        for alpha in alphas:
            _, grads, deltas = run.run_coeffs((alpha * path).unsqueeze(0), with_grad=True,
                                              keep_writes=True)
            total += scores.from_grads(run, grads, deltas)
    values = scores.on_edges(run, total / steps)
    grads_clean = scores.clean_gradients(run) if qk_fix else None
    return scores.finish(run, values, "eap-ig", {"steps": steps, "ig": ig}, qk_fix, verify,
                  grads_clean)


def _stacked_steps(run: GraphRun, path: torch.Tensor, alphas: list[float]) -> torch.Tensor:
    """``sum_k delta . grad_k`` over the steps, on inputs: the steps run as stacked copies of
    one forward/backward (as many as the memory budget allows), and since every step
    multiplies the same clean-to-corrupted delta, their gradients are summed (float64) before
    the one product with it. Every edge out of the embedding at ``alpha`` is the input
    embedding moved by ``alpha`` times its delta (every receiver reads it), so each step is a
    forward from a shifted input (``path`` is that, checked), with the receivers' gradients
    from :mod:`mechsink.discover.plain_grads` where its premises hold (graph mode
    otherwise)."""
    g = run.graph
    assert bool((path[1:] == 0).all()) and bool((path[0] == g.valid[0].double()).all())
    b, per = run.batch, run.copies_per_forward(injects=False)
    zeros = torch.zeros(1, len(g.senders), len(g.receivers))
    summed: dict[str, torch.Tensor] = {}
    for lo in range(0, len(alphas), per):
        chunk = alphas[lo:lo + per]
        grads = plain_grads.receiver_grads(run, chunk) if plain_grads.ENABLED else None
        if grads is None:  # graph mode: each head reads its own fork of the residual
            _, grads, _ = run.run_coeffs(zeros.expand(len(chunk), -1, -1), with_grad=True,
                                         embed_shift=torch.tensor(chunk))
        for name, grad in grads.items():
            part = grad.view(len(chunk), b, *grad.shape[1:]).double().sum(0)
            summed[name] = part if name not in summed else summed[name] + part
    return scores.from_grads(run, summed)
