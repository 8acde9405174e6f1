"""Edge attribution patching (Syed, Rager and Conmy 2023, "Attribution Patching Outperforms
Automated Circuit Discovery"): ``(w_u^corr - w_u^clean) . dm/dx_v`` at the clean run, every
edge from one forward and one backward pass."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mechsink.discover.methods import QK_FIX, VERIFY, register

if TYPE_CHECKING:
    from mechsink.discover.graph_run import GraphRun
    from mechsink.discover.scores import EdgeScores


@register("eap", options=(QK_FIX, VERIFY))
def eap(run: GraphRun, *, qk_fix: bool = True, verify: int = 20) -> EdgeScores:
    """Edge attribution patching at the clean run (one forward, one backward)."""
    from mechsink.discover import scores

    scores.check_verify(verify)
    grads = scores.clean_gradients(run)
    values = scores.on_edges(run, scores.from_grads(run, grads))
    return scores.finish(run, values, "eap", {}, qk_fix, verify, grads)
