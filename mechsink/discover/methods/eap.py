"""Edge attribution patching (Syed, Rager and Conmy 2023, "Attribution Patching Outperforms
Automated Circuit Discovery"): ``(w_u^corr - w_u^clean) . dm/dx_v`` at the clean run, every
edge from one forward and one backward pass."""

from __future__ import annotations

from mechsink.discover.methods import register
from mechsink.discover.run import GraphRun
from mechsink.discover.scores import (
    EdgeScores,
    check_verify,
    clean_gradients,
    finish,
    from_grads,
    on_edges,
)


@register("eap")
def eap(run: GraphRun, *, qk_fix: bool = True, verify: int = 20) -> EdgeScores:
    """Edge attribution patching at the clean run (one forward, one backward)."""
    check_verify(verify)
    grads = clean_gradients(run)
    values = on_edges(run, from_grads(run, grads))
    return finish(run, values, "eap", {}, qk_fix, verify, grads)
