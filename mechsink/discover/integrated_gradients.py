"""The steps of EAP-IG (:mod:`mechsink.discover.methods.eap_ig`): the gradients summed over the
interpolation points on each path from clean to corrupted (inputs, one sender group's
activations at a time, the reference's whole-model runs per group, every edge coefficient at
once), each returned as the sender x receiver matrix of summed ``delta . grad`` products that
the method divides by its step count."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from mechsink.discover import plain_grads, scores
from mechsink.discover.graph_run import GraphRun, graph_mode
from mechsink.model import act_name


def coefficient_steps(run: GraphRun, alphas: list[float], edges: Sequence[int] | None
                      ) -> Float[Tensor, "sender receiver"]:
    """``sum_k delta . grad_k`` with every edge coefficient (or those of ``edges`` alone, the
    others clean) at each ``alpha``: the gradients with respect to the coefficients, every
    sender's write kept at every receiver slot for the backward pass."""
    g = run.graph
    if edges is None:
        path = g.valid.clone().double()
    else:
        sel = torch.zeros(g.n_edges, dtype=torch.float64)
        sel[torch.as_tensor(list(edges), dtype=torch.long)] = 1.0
        path = g.dense(sel)
    total = torch.zeros(len(g.senders), len(g.receivers), dtype=torch.float64)
    for alpha in alphas:
        _, grads, deltas = run.run_coeffs((alpha * path).unsqueeze(0), with_grad=True,
                                          keep_writes=True)
        total += scores.from_grads(run, grads, deltas)
    return total


def _add(summed: dict[str, Tensor], grads: dict[str, Tensor], copies: int, batch: int) -> None:
    """Add each hook's gradient, summed over the ``copies`` stacked steps (float64)."""
    for name, grad in grads.items():
        part = grad.view(copies, batch, *grad.shape[1:]).sum(0, dtype=torch.float64)
        summed[name] = part if name not in summed else summed[name] + part


def stacked_steps(run: GraphRun, alphas: list[float]) -> Tensor:
    """``sum_k delta . grad_k`` over the steps, on inputs: the steps run as stacked copies of
    one forward/backward (as many as the memory budget allows), and since every step
    multiplies the same clean-to-corrupted delta, their gradients are summed (float64) before
    the one product with it. Every edge out of the embedding at ``alpha`` is the input
    embedding moved by ``alpha`` times its delta (every receiver reads it), so each step is a
    forward from a shifted input, with the receivers' gradients from
    :mod:`mechsink.discover.plain_grads` where its premises hold (graph mode otherwise)."""
    g = run.graph
    b, per = run.batch, run.copies_per_forward(injects=False)
    zeros = torch.zeros(1, len(g.senders), len(g.receivers))
    summed: dict[str, Tensor] = {}
    for lo in range(0, len(alphas), per):
        chunk = alphas[lo:lo + per]
        grads = plain_grads.receiver_grads(run, chunk) if plain_grads.ENABLED else None
        if grads is None:  # graph mode: each head reads its own fork of the residual
            _, grads, _ = run.run_coeffs(zeros.expand(len(chunk), -1, -1), with_grad=True,
                                         embed_shift=torch.tensor(chunk))
        _add(summed, grads, len(chunk), b)
    return scores.from_grads(run, summed)


def sender_groups(run: GraphRun) -> list[list[int]]:
    """The senders by stage, in forward order: the embedding, each layer's heads, each
    layer's MLP with its neuron senders (what IG on activations moves together)."""
    out: dict[int, list[int]] = {}
    for i, s in enumerate(run.graph.senders):
        out.setdefault(s.stage, []).append(i)
    return [out[k] for k in sorted(out)]


def group_steps(run: GraphRun, alphas: list[float]) -> Float[Tensor, "sender receiver"]:
    """IG on activations, one sender group at a time (the module doc): the steps of a group
    run as stacked copies (within the memory budget) from the group's block, the gradients at
    the receivers after it summed over the steps, and the group's rows of the score matrix
    are its deltas times those sums. The embedding's group is the input path's first step.
    Where :mod:`mechsink.discover.plain_grads`'s premises fail, graph mode runs the same
    interpolation (:func:`graph_group_grads`)."""
    g = run.graph
    total = torch.zeros(len(g.senders), len(g.receivers), dtype=torch.float64)
    b = run.batch
    plain = plain_grads.ENABLED
    for group in sender_groups(run):
        summed: dict[str, Tensor] = {}
        while True:
            per = run.copies_per_forward(injects=not plain)
            for lo in range(0, len(alphas), per):
                chunk = alphas[lo:lo + per]
                grads = _group_grads(run, group, chunk, plain)
                if grads is None:  # a premise failed: this group again, in graph mode
                    break
                _add(summed, grads, len(chunk), b)
            else:
                break
            plain, summed = False, {}
        total[group] = group_rows(run, summed, group)
    return total


def reference_group_steps(run: GraphRun, alphas: list[float]
                           ) -> Float[Tensor, "sender receiver"]:
    """IG on activations as the reference implementation sums it: for every group and step a
    whole-model run (graph mode) with that group's writes moved, the gradient at *every*
    receiver added up over all of them, divided by the number of groups, and every sender's
    delta times that one average (the ``/ steps`` follows in
    :func:`~mechsink.discover.methods.eap_ig.eap_ig`)."""
    groups = sender_groups(run)
    summed: dict[str, Tensor] = {}
    per = run.copies_per_forward(injects=True)
    for group in groups:
        for lo in range(0, len(alphas), per):
            chunk = alphas[lo:lo + per]
            _add(summed, graph_group_grads(run, group, chunk, whole=True), len(chunk), run.batch)
    return scores.from_grads(run, summed) / len(groups)


def _group_grads(run: GraphRun, group: list[int], chunk: list[float], plain: bool
                 ) -> dict[str, Tensor] | None:
    """The receivers' gradients with ``group``'s writes moved by each of ``chunk`` (stacked
    copies); None when the plain run's premises fail."""
    if plain:
        if run.graph.senders[group[0]].stage == 0:
            return plain_grads.receiver_grads(run, chunk)
        return plain_grads.receiver_grads(run, chunk, group=group)
    return graph_group_grads(run, group, chunk)


def graph_group_grads(run: GraphRun, group: list[int], chunk: list[float], *,
                      whole: bool = False) -> dict[str, Tensor]:
    """Graph mode (every head reading its own fork of the residual): ``group``'s writes moved
    by each of ``chunk`` where they enter the residual stream (``hook_attn_out``, or the
    post-attention norm's output on models that normalise the heads' sum; ``hook_resid_post``
    after an MLP), the run from the group's block, the gradient kept at every receiver slot
    after it. The same as :meth:`GraphRun.run_coeffs` with ``alpha`` on every edge out of the
    group (tests compare them), whose hooks keep every write for the backward pass; here the
    hooks hold no tensors, so a run's autograd graph is freed when it ends. ``whole``: the run
    starts at the embedding and the gradient reaches every receiver, also those before the
    group (the reference convention)."""
    g = run.graph
    stage = g.senders[group[0]].stage
    start = max(0, (stage - 1) // 2)
    at = None  # the embedding: the run's input moves
    if stage and stage % 2 == 0:
        at = act_name("resid_post", start)
    elif stage:
        at = act_name("ln1_post.hook_out" if run.post_norm else "attn_out", start)
    grads: dict[str, Tensor] = {}

    def keep(name: str) -> Any:
        def hook(act: Tensor, hook: Any) -> Tensor | None:
            if not act.requires_grad:
                return None
            new = act.view_as(act)  # its own node: q, k and v may read one tensor
            new.register_hook(lambda gr: grads.__setitem__(name, gr))
            return new
        return hook

    begin = 0 if whole else start
    resid, leaf, inject = plain_grads.moved_input(run, begin, at, None if at is None
                                                  else group, chunk)
    if whole and at is not None:  # the backward reaches the receivers before the group too
        resid = leaf = resid.detach().requires_grad_(True)
    start = begin
    hooks = inject + [(slot.hook, keep(slot.hook)) for slot in run.slots(start)]
    with graph_mode(run.model):
        plain_grads.gradient_run(run, resid, leaf, start, len(chunk), hooks)
    return grads


def group_rows(run: GraphRun, grads: dict[str, Tensor], group: list[int]
               ) -> Float[Tensor, "group receiver"]:
    """``delta_u . grad_v`` summed over batch and positions for the senders ``u`` of ``group``
    and every receiver ``v`` reading after them (0 elsewhere): the rows of
    :func:`~mechsink.discover.scores.from_grads` of one group, without the product for every
    other sender. Each slot's gradient is read once where it lies (one batched product over
    tokens, float64), never copied into another layout."""
    g = run.graph
    out = torch.zeros(len(group), len(g.receivers), dtype=torch.float64)
    stage = g.senders[group[0]].stage
    delta = scores.token_rows(run, run.delta[:, :, group]).double()  # [token, u, d]
    for _, cols, grad in scores.grad_columns(run, grads, after_stage=stage):
        # [token, u, d] @ [token, d, column] -> [token, u, column], summed over tokens
        prod = torch.matmul(delta, grad.double().transpose(1, 2)).sum(0)
        out.index_add_(1, torch.tensor(cols), prod.cpu())  # the scores stay on the CPU
    return out
