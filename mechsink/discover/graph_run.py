"""Running a model as an edge graph: every receiver reads its own copy of the residual stream.

:class:`GraphRun` is built once per call (tokens, bound metric, what each sender writes on the
clean run and what it writes when corrupted) and runs the model with *edge coefficients*
``C[sender, receiver]``: receiver ``v`` reads

    x_v + sum_u C[u, v] * (w_u^corrupted - w_u^run)

where ``w_u^run`` is what sender ``u`` writes in this run. ``C = 0`` is the clean model;
``C[u, v] = 1`` corrupts edge ``u -> v`` (the receiver sees the corrupted sender, everything
else stays live, as in ACDC's and auto-circuit's edge patching); ``C = 1`` on every edge is the
corrupted run. The gradient of the metric with respect to ``C`` at 0 is edge attribution
patching (Syed et al. 2023).

Receivers read separate copies through TransformerLens's per-head input hooks
(``use_split_qkv_input``: ``hook_q_input`` ``[batch, pos, head, d_model]``, keys and values per
KV head; ``use_attn_result``: each head's write ``hook_result``; ``use_hook_mlp_in``), switched
on only inside :func:`graph_mode`.

Neuron senders (``neurons={11: [1229, 1487]}``): neuron ``n`` of MLP ``L`` writes
``post_n * W_out[n]`` (``mlp.hook_post`` times its row of the down projection) and the MLP's
own sender writes the rest, ``mlp_out - sum_n post_n W_out[n]``, so the senders of a block
still add up to its write exactly. ``neurons="super"``: the census's complete super-neuron
sets (:mod:`mechsink.discover.super_nodes`). Not on models that normalise the MLP's output
before the residual add (``ln2_post``: OLMo 2, Gemma 2/3): a neuron's share of the down
projection is not its share of the write there, and such a request is refused in one line.

Models with a norm after attention (OLMo 2's and Gemma 2's sandwich norms, GLM-4, EXAONE 4)
write ``norm(sum of heads)``. For the runs with edge coefficients (EAP's gradients, circuits'
faithfulness) a head's write is its share with the norm's scale taken from the run (``g *
result_h / scale``), which adds up to the block's write exactly (a corrupted head's write uses
the scale of the corrupted run): a linearisation at the run's scale. Exact edge patches
(:meth:`GraphRun.exact`, the QK fix) recompute the norm instead: head ``u`` alone corrupted
changes its block's write by ``norm(R + result_u^corr - result_u) - norm(R)`` (``R`` the
norm's input on the clean run), what path patching's frozen run gives (Wang et al. 2022,
"Interpretability in the Wild"), so an exact edge equals path patching of the same edge.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mechsink.discover import plain_grads
from mechsink.discover.graph import Graph, metric_point
from mechsink.discover.memory import check_fits
from mechsink.discover.super_nodes import super_neuron_nodes
from mechsink.errors import BadInputError
from mechsink.interventions.ablation import Ablation, as_ablation
from mechsink.model import act_name, block_norm, down_projection, hook_names, write_in_place
from mechsink.model.memory import memory_budget as resolve_budget
from mechsink.model.support import architecture, check_supported
from mechsink.model.switches import graph_mode, mlp_in_only
from mechsink.names import explicit_bos
from mechsink.patching import engine, plan
from mechsink.patching.engine import TokensLike
from mechsink.patching.metrics import Metric
from mechsink.patching.nodes import Receiver, Sender

HookFn = Callable[..., Any]


def _own_copy(hook: str) -> bool:
    """Receiver inputs must be replaced, never written in place: the MLP's input aliases the
    residual stream, and a per-head fork with one (KV) head can be a view of it."""
    return hook.endswith(("hook_mlp_in", "_input"))


@dataclass
class Slot:
    """Receivers read at one hook: the hook, the receivers' columns (numbers in
    ``graph.receivers``), whether the activation has a head axis (q/k/v inputs, one column per
    head) and whether one column feeds every head (the metric at an attention input)."""

    hook: str
    cols: list[int]
    heads: bool
    broadcast: bool = False


class GraphRun:
    """One setup per call: tokens, metric, senders' clean and corrupted writes, the graph.

    ``corrupted``: counterfactual tokens (each sender's corrupted write is its write on that
    run), or ``ablation`` (:mod:`mechsink.interventions.ablation`: zero, batch_mean,
    position_mean, resample) of each sender's clean write. ``positions``: corrupt senders at
    these positions only (default all; ``position_mean`` needs them: it is the mean over the
    others). The clean and corrupted runs are recorded by :func:`mechsink.patching.engine.setup`
    (one forward for both, keys and values kept), so exact edge patches reuse the clean run's
    prefix before the first corrupted position.

    The interface a discovery method (:mod:`mechsink.discover.methods`) uses:

    - ``graph`` (:class:`~mechsink.discover.graph.Graph`), ``metric`` (bound to the clean run),
      ``clean_value``, ``corrupted_value`` (None under an ablation), ``ablation``,
      ``positions`` (a bool mask over positions), ``batch``, ``seq_len``, ``model``,
      ``memory_budget`` (and ``chunk_budget``: what it leaves beside the run's own tensors, for
      a method's chunks);
    - ``clean``: the clean :class:`~mechsink.patching.engine.Run` (``clean.acts`` holds each
      graph layer's ``hook_resid_pre`` and ``hook_pattern``);
    - ``delta`` ``[batch, pos, sender, d_model]``: each sender's corrupted minus clean write
      (``edge_delta``: what one edge patched alone adds, the norm recomputed after attention);
    - :meth:`slots` (where receivers read, in forward order), :meth:`run_coeffs` (forwards
      with edge coefficients, gradients on request), :meth:`exact` (edges patched one at a
      time), :meth:`mask_values` (edges outside a circuit corrupted) and :attr:`empty_value`.
    """

    def __init__(
        self,
        model: Any,
        clean: TokensLike,
        metric: Metric | Callable[[Tensor], Tensor],
        *,
        corrupted: TokensLike | None = None,
        ablation: str | Ablation | None = None,
        positions: Sequence[int] | None = None,
        prepend_bos: bool | None = None,
        seed: int = 0,
        memory_budget: int | str | None = None,
        neurons: Mapping[int, Sequence[int]] | str | None = None,
    ) -> None:
        check_supported(model, "discover")
        abl = as_ablation(ablation, seed=seed)
        if (abl is None) == (corrupted is None):
            raise BadInputError("give either corrupted tokens or an ablation, not both and "
                                "not neither.")
        self.model = model
        self.ablation = abl
        #: bytes of activations this run's chunks may hold (what the device has free unless
        #: given: :func:`mechsink.model.memory.memory_budget`), read once
        self.memory_budget: int = resolve_budget(model, memory_budget)
        if neurons and act_name("ln2_post.hook_scale", 0) in hook_names(model):
            raise BadInputError(
                f"{architecture(model)} normalises each MLP's output before it joins the "
                "residual stream (blocks.<l>.ln2_post), so a neuron's share of the down "
                "projection is not its share of the MLP's write: neuron senders are not "
                "supported on it (they would need that norm recomputed per neuron); use the "
                "MLP senders (neurons=None).")
        prepend_bos = explicit_bos(prepend_bos, clean, corrupted, where="GraphRun")
        tokens = engine.as_tokens(model, clean, prepend_bos=prepend_bos)
        batch, seq_len = tokens.shape
        self.positions = self._position_mask(positions, seq_len, abl)
        prepared = engine.prepare_metrics(model, metric, seq_len)  # once: setup reuses it
        (first_metric,) = prepared.metrics
        if isinstance(neurons, str):
            if neurons != "super":
                raise BadInputError(f"neurons must map layers to neuron indices or be "
                                    f"'super', got {neurons!r}.")
            neurons = super_neuron_nodes(model, tokens, metric_point(model, first_metric))
        self.graph = Graph.build(model, first_metric, neurons)
        self.post_norm = act_name("ln1_post.hook_scale", 0) in hook_names(model)
        held = check_fits(model, batch, seq_len, len(self.graph.senders), self.memory_budget,
                          post_norm=self.post_norm)  # before any forward
        #: bytes the chunks (stacked copies, the QK fix's patterns) may hold: what the budget
        #: leaves beside the tensors the run holds throughout
        self.chunk_budget: int = max(1, self.memory_budget - held)
        g = self.graph
        w_out = down_projection(model) if g.neurons else None
        #: layer -> the neuron senders' rows of W_out, ``[neuron, d_model]``
        self.w_out: dict[int, Tensor] = {} if w_out is None else {
            layer: w_out[layer, idx] for layer, idx in g.neurons.items()}
        names = set(self._write_hooks(range(g.n_layers)))
        names |= {act_name("resid_pre", layer) for layer in (*range(g.n_layers), g.point.layer)}
        names |= {act_name("pattern", layer) for layer in range(g.n_layers)}
        known = hook_names(model)  # q/k/v: the check behind exact patches without forks
        names |= {n for layer in range(g.n_layers) for k in "qkv"
                  if (n := act_name(k, layer)) in known}
        with torch.no_grad(), graph_mode(model, inputs=False):
            s = engine.setup(model, tokens, corrupted, prepared, prepend_bos=prepend_bos,
                             keep={"clean": names, "corrupted": names},
                             last_layer=prepared.last_layer)
        self.clean, self.needs, (self.metric,) = s.clean, s.needs, s.metrics
        self.tokens = s.clean.tokens
        self.clean_value = float(s.clean_values[0])
        corr_value = s.corrupted_values[0]
        self.corrupted_value: float | None = None if corr_value is None else float(corr_value)
        with torch.no_grad():
            self.norm_gain = self._norm_gains(self.clean.acts) if self.post_norm else {}
            self.w_clean = self._writes(self.clean.acts)
            if s.corrupted is not None:
                w_corr = self._writes(s.corrupted.acts)
            else:
                assert abl is not None
                w_corr = torch.stack([abl.values(self.w_clean[:, :, u], self.positions)
                                      for u in range(len(g.senders))], 2)
            if not bool(self.positions.all()):
                where = self.positions.to(w_corr.device).view(1, seq_len, 1, 1)
                w_corr = torch.where(where, w_corr, self.w_clean)
            #: each sender's corrupted minus clean write (computed in place: the corrupted
            #: writes themselves, :attr:`w_corr`, are rebuilt only by the runs that inject)
            self.delta: Float[Tensor, "batch pos sender d_model"] = w_corr.sub_(self.w_clean)
            #: what an exact edge patch adds to its receiver's input: ``delta``, except that a
            #: post-normed head's column recomputes its block's norm (:meth:`_edge_delta`)
            self.edge_delta: Float[Tensor, "batch pos sender d_model"] = self._edge_delta(
                self.clean.acts, None if s.corrupted is None else s.corrupted.acts)
        self.batch, self.seq_len = batch, seq_len

    @cached_property
    def w_corr(self) -> Float[Tensor, "batch pos sender d_model"]:
        """Each sender's corrupted write (``w_clean + delta``), built on first use: only the
        runs with edge coefficients read it, and holding it costs a ``delta``'s memory."""
        return self.w_clean + self.delta

    @staticmethod
    def _position_mask(positions: Sequence[int] | None, seq_len: int,
                       abl: Ablation | None) -> Bool[Tensor, " pos"]:
        """The positions whose senders are corrupted, checked before any forward."""
        mask = torch.zeros(seq_len, dtype=torch.bool)
        if positions is None:
            if abl is not None and abl.kind == "position_mean":
                raise BadInputError("position_mean ablation is the mean over the positions not "
                                    "ablated: give positions=[...] (e.g. [0]).")
            mask[:] = True
            return mask
        for p in positions:
            if not -seq_len <= p < seq_len:
                raise BadInputError(f"position {p} is outside 0..{seq_len - 1}.")
            mask[p] = True
        if abl is not None and abl.kind == "position_mean" and seq_len < 2:
            raise BadInputError("position_mean ablation is the mean over the positions not "
                                f"ablated: the prompts are {seq_len} token long (an empty "
                                "prompt is BOS alone); give prompts of at least 2 tokens.")
        if abl is not None and abl.kind == "position_mean" and bool(mask.all()):
            raise BadInputError("position_mean needs at least one position left alone.")
        return mask

    @property
    def first_position(self) -> int:
        """The first position whose senders are corrupted (nothing before it changes)."""
        return int(self.positions.nonzero()[0, 0])

    # ---- what senders write ------------------------------------------------------------

    def _write_hooks(self, layers: Any) -> list[str]:
        out = [Sender("embed").write_hook]
        for layer in layers:
            out += [Sender("head", layer).write_hook, Sender("mlp", layer).write_hook]
            if layer in self.graph.neurons:
                out.append(Sender("neuron", layer).hook)
            if self.post_norm:
                out += [act_name(f"ln1_post.{x}", layer)
                        for x in ("hook_in", "hook_scale", "hook_normalized", "hook_out")]
        return out

    def _edge_delta(self, clean: dict[str, Tensor], corrupted: dict[str, Tensor] | None
                    ) -> Float[Tensor, "batch pos sender d_model"]:
        """``delta`` with each head column of a post-normed block replaced by the change of the
        block's write when that head alone is corrupted and the norm recomputed: ``norm(R +
        dr_u) - norm(R)``, ``R`` the norm's input on the clean run (every head's result plus
        the output bias), ``dr_u`` the head's corrupted minus clean result at the corrupted
        positions. The norm is the model's own module (``blocks.<l>.ln1_post``), so its gain,
        bias, epsilon and any offset are the model's."""
        if not self.post_norm:
            return self.delta
        g, out = self.graph, self.delta.clone()
        where = self.positions.to(self.delta.device).view(1, -1, 1, 1)
        for layer in range(g.n_layers):
            cols = [i for i, s in enumerate(g.senders) if s.kind == "head" and s.layer == layer]
            if not cols:
                continue
            name = Sender("head", layer).write_hook
            r_clean = clean[name]  # [batch, pos, head, d_model]
            if corrupted is not None:
                r_corr = corrupted[name]
            else:
                assert self.ablation is not None
                r_corr = self.ablation.values(r_clean, self.positions)
            dr = torch.where(where, r_corr - r_clean, torch.zeros_like(r_clean))
            base = clean[act_name("ln1_post.hook_in", layer)]
            norm = block_norm(self.model, layer, "ln1_post")
            assert norm is not None  # post_norm: the model hooks it
            at_base = norm(base)
            for col in cols:
                h = g.senders[col].index
                out[:, :, col] = (norm(base + dr[:, :, h]) - at_base).to(out.dtype)
        return out

    def _norm_gains(self, acts: dict[str, Tensor]) -> dict[int, Tensor]:
        """The post-attention norm's gain per layer, read off the clean run (out / normalized,
        median over positions: robust where a normalized entry is near 0)."""
        gains = {}
        for layer in range(self.graph.n_layers):
            out = acts[act_name("ln1_post.hook_out", layer)]
            nrm = acts[act_name("ln1_post.hook_normalized", layer)]
            ratio = (out / nrm).flatten(0, -2)
            ok = nrm.flatten(0, -2).abs() > 1e-3
            gains[layer] = torch.where(ok, ratio, torch.nan).nanmedian(0).values.nan_to_num(0.0)
        return gains

    def head_writes(self, acts: dict[str, Tensor], layer: int) -> Tensor:
        """``[batch, pos, head, d_model]``: what each head of ``layer`` adds to the residual."""
        result = acts[Sender("head", layer).write_hook]
        if not self.post_norm:
            return result
        scale = acts[act_name("ln1_post.hook_scale", layer)]
        return result / scale.unsqueeze(-1) * self.norm_gain[layer]

    def _writes(self, acts: dict[str, Tensor]) -> Float[Tensor, "batch pos sender d_model"]:
        cols = [acts[Sender("embed").write_hook].unsqueeze(2)]
        for layer in range(self.graph.n_layers):
            cols.append(self.head_writes(acts, layer))
            if self._has_mlp(layer):
                cols.append(self.mlp_writes(acts[Sender("mlp", layer).write_hook],
                                            acts.get(Sender("neuron", layer).hook), layer))
        return torch.cat(cols, 2)

    def mlp_writes(self, out: Tensor, post: Tensor | None, layer: int
                   ) -> Float[Tensor, "batch pos n d_model"]:
        """MLP ``layer``'s senders' writes from its output and (with neuron senders) its
        ``hook_post``: the MLP's own (the rest), then each neuron's ``post_n * W_out[n]``."""
        if layer not in self.w_out:
            return out.unsqueeze(2)
        assert post is not None
        idx = self.graph.neurons[layer]
        own = post[..., idx].unsqueeze(-1) * self.w_out[layer].to(post.dtype)
        return torch.cat([(out - own.sum(2)).unsqueeze(2), own], 2)

    def _has_mlp(self, layer: int) -> bool:
        return any(s.kind == "mlp" and s.layer == layer for s in self.graph.senders)

    # ---- where receivers read ----------------------------------------------------------

    def slots(self, layer_from: int = 0) -> list[Slot]:
        """Every receiver hook from block ``layer_from`` on, in forward order."""
        g, out = self.graph, []
        by_key: dict[tuple[str, int | None], list[int]] = {}
        for i, r in enumerate(g.receivers):
            by_key.setdefault((r.kind, r.layer), []).append(i)
        for layer in range(layer_from, g.n_layers):
            for kind in ("q", "k", "v"):
                out.append(Slot(Receiver(kind, layer).read_hook, by_key[(kind, layer)], True))
            if ("mlp", layer) in by_key:
                out.append(Slot(Receiver("mlp", layer).read_hook, by_key[("mlp", layer)],
                                False))
        metric_col = [len(g.receivers) - 1]
        at_attn = g.point.kind == "attn"
        out += [Slot(hook, metric_col, at_attn, at_attn) for hook, _ in g.point.sites]
        return out

    # ---- runs --------------------------------------------------------------------------

    def run_coeffs(
        self, coeffs: Float[Tensor, "copies sender receiver"], *, with_grad: bool = False,
        keep_writes: bool = False, pattern_layers: Sequence[int] = (),
        embed_shift: Float[Tensor, " copies"] | None = None,
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        """Run ``copies`` stacked forwards, copy ``c`` with edge coefficients ``coeffs[c]``.

        Returns the metric per copy ``[copies]``, and (``with_grad``) the gradient of each
        copy's metric at each receiver hook (rows ``c * batch ..``; and at
        ``pattern_layers``' attention patterns) and the senders' run deltas ``w_corr - w_run``
        per hook (``keep_writes``, one copy only). ``embed_shift[c]``: copy ``c``'s input
        embedding moves by that fraction of its corrupted-minus-clean delta, which every
        receiver reads (the same as coefficient ``embed_shift[c]`` on every edge out of the
        embedding, without one injection per receiver slot).
        """
        copies = coeffs.shape[0]
        grads: dict[str, Tensor] = {}
        deltas: dict[str, Tensor] = {}
        hooks = _CoeffHooks(self, coeffs.to(self.delta), with_grad, keep_writes,
                            grads, deltas).hooks()
        for layer in pattern_layers:
            hooks.append((act_name("pattern", layer), _grad_keeper(grads,
                                                                   act_name("pattern", layer))))
        resid0 = self.clean.acts[act_name("resid_pre", 0)].repeat(copies, 1, 1)
        if embed_shift is not None:
            shift = embed_shift.to(resid0).view(copies, 1, 1, 1) * self.delta[:, :, 0]
            resid0 = resid0 + shift.flatten(0, 1)
        if with_grad:
            resid0 = resid0.detach().clone().requires_grad_(True)
        with graph_mode(self.model):
            vals = engine.run_patched(self.model, self.clean, [self.metric], self.needs,
                                      resid0, 0, copies, hooks, stacked=True, grad=with_grad,
                                      context="on the edge-patched run")[0]
            values = torch.stack(vals)
            if with_grad:
                torch.autograd.grad(values.sum(), [resid0], allow_unused=True)
        return values.detach().double(), grads, deltas

    # ---- exact edge patches ------------------------------------------------------------

    def exact(self, edges: Int[Tensor, " n"] | Sequence[int], *, batch_size: int | None = None
              ) -> Float[Tensor, " n"]:
        """Metric with each edge alone corrupted (the receiver reads the corrupted sender),
        one forward per batch of edges from the receiver's layer on, recomputing only the
        positions from the first corrupted one."""
        g = self.graph
        edges = [int(e) for e in edges]
        out = torch.empty(len(edges), dtype=torch.float64)
        layer = [g.receiver_layer(g.receivers[int(g.dst[e])]) for e in edges]
        order = sorted(range(len(edges)), key=lambda i: layer[i])
        first = engine.reused_prefix(self.clean, self.first_position)
        per = batch_size or plan.copies_per_batch(
            self.model, self.batch, self.seq_len, first, plan.logit_positions(self.needs),
            memory_budget=self.chunk_budget)
        # the staircase: a batch holds edges of several receiver layers, each copy joining
        # the forward at its receiver's block (without it: one receiver layer per batch)
        batches: list[list[int]] = []
        if plan.staircase(self.model):
            batches = [order[lo:lo + per] for lo in range(0, len(order), per)]
        else:
            for lay in sorted(set(layer)):
                same = [i for i in order if layer[i] == lay]
                batches += [same[lo:lo + per] for lo in range(0, len(same), per)]
        projections = self.head_projections if plain_grads.ENABLED else None
        mode = graph_mode(self.model) if projections is None else mlp_in_only(self.model)
        with torch.no_grad(), mode:
            for chunk in batches:
                joins = [layer[i] for i in chunk]
                out[chunk] = self._exact_batch(joins, [edges[i] for i in chunk], first,
                                               projections)
        return out

    @cached_property
    def head_projections(self) -> dict[str, Tensor] | None:
        """The query, key and value weights ``[layer, head, d_model, d_head]`` when every
        layer's ``attn.hook_q/k/v`` is its ``ln1``'s output of the residual times them plus a
        bias (checked on the clean run, every position and layer); None otherwise (a norm on
        q/k after the projection, a fused or post-normed attention, no ``ln1``).

        Then a head's own input ``R + d`` changes its query by ``(ln1(R + d) - ln1(R)) W[h]``
        exactly, and an exact edge patch adds that at ``attn.hook_q`` (before rotary) with
        the model run plainly: graph mode's per-head copies of the residual, each normalised
        and projected on its own, cost more than the rest of the block."""
        with torch.no_grad():
            return self._check_projections()

    @cached_property
    def head_input_weights(self) -> dict[str, Tensor]:
        """Per-head (query) and per-KV-head (key, value) input projections, stacked once per
        run: each read of ``model.W_Q`` stacks every layer's weights again."""
        return {k: plain_grads.head_weights(self.model, k) for k in "qkv"}

    def _check_projections(self) -> dict[str, Tensor] | None:
        model, acts = self.model, self.clean.acts
        weights = self.head_input_weights
        for layer in range(self.graph.n_layers):
            norm = block_norm(model, layer, "ln1")
            if norm is None or self.post_norm:
                return None
            normed = norm(acts[act_name("resid_pre", layer)])
            seen = {k: t for k in "qkv" if (t := acts.get(act_name(k, layer))) is not None}
            if not plain_grads.projections_hold(model, normed, seen, weights, layer):
                return None
        return weights

    def _exact_batch(self, joins: list[int], edges: list[int], first: int,
                     projections: dict[str, Tensor] | None = None) -> Tensor:
        """One forward for ``edges``, copy ``c`` joining at block ``joins[c]`` (sorted); with
        ``projections`` (:attr:`head_projections`) the model runs without per-head forks and
        an edge into a query/key/value adds its projected change at ``attn.hook_q/k/v``."""
        g, b = self.graph, self.batch
        delta = self.edge_delta[:, first:]  # the patched runs compute positions ``first..``
        #: hook -> (copy, head or None, what the copy's rows get added)
        per_hook: dict[str, list[tuple[int, int | None, Tensor]]] = {}
        changes = _HeadChanges(self, projections, first) if projections is not None else None
        for c, e in enumerate(edges):
            u, r = int(g.src[e]), g.receivers[int(g.dst[e])]
            for hook, head in g.sites(r):
                add = delta[:, :, u]
                kind = _READS.get(hook.rsplit(".", 1)[-1])
                if changes is not None and kind is not None:
                    layer = r.layer if r.kind != "metric" else g.point.layer
                    hook, add = act_name(kind, layer), changes.of(kind, layer, u, head)
                per_hook.setdefault(hook, []).append((c, head, add))

        def patch(items: list[tuple[int, int | None, Tensor]]) -> HookFn:
            def hook(act: Tensor, hook: Any) -> Tensor:
                new = act.clone()
                for c, head, add in items:
                    rows = slice(c * b, (c + 1) * b)
                    if head is None:
                        new[rows] += add.unsqueeze(2) if new.ndim == 4 and add.ndim == 3 \
                            else add
                    else:
                        new[rows, :, head] += add
                return new if _own_copy(hook.name) else write_in_place(act, new)
            return hook

        hooks = [(h, patch(items)) for h, items in per_hook.items()]
        start = joins[0]
        resid = self.clean.acts[act_name("resid_pre", start)]
        vals = engine.run_patched(self.model, self.clean, [self.metric], self.needs, resid,
                                  start, len(edges), hooks, first=first,
                                  joins=None if len(set(joins)) == 1 else joins,
                                  context="on the edge-patched run")
        return torch.stack(vals[0])

    @cached_property
    def empty_value(self) -> float:
        """The metric with every edge corrupted (the corrupted run, or the ablated model):
        the 0 of faithfulness, computed once."""
        ones = self.graph.valid.to(self.delta.dtype).unsqueeze(0)
        return float(self.run_coeffs(ones)[0][0])

    def copies_per_forward(self, *, injects: bool = True) -> int:
        """Edge-coefficient runs stacked per forward: at most 32, within the memory budget
        (each copy holds the senders' corrupted writes, what they write in the run, their
        difference and the injected inputs, ``[batch, pos, sender, d_model]`` each, besides
        its activations; ``injects=False``: a run without injections, its activations
        only)."""
        budget = self.chunk_budget
        held = 4 * self.delta.numel() * self.delta.element_size() if injects else 0
        per = held + plan.bytes_per_copy(self.model, self.batch, self.seq_len, 0, -1)
        return max(1, min(32, budget // max(1, per)))

    def mask_values(self, keep: Bool[Tensor, "copies edge"], *, batch: int | None = None
                    ) -> Tensor:
        """Metric with every edge *outside* ``keep[c]`` corrupted, per row ``c`` (``batch``
        rows per forward; default :meth:`copies_per_forward`).

        Identical rows run once, and two rows need no forward of their own: keeping every edge
        is the clean run (:attr:`clean_value`), keeping none the every-edge-corrupted run
        (:attr:`empty_value`, computed once per run). A faithfulness curve's random baselines
        repeat both at its first and last sizes."""
        keep = keep.to(torch.bool)
        unique, inverse = torch.unique(keep, dim=0, return_inverse=True)
        values = torch.empty(unique.shape[0], dtype=torch.float64)
        every, none = unique.all(1), ~unique.any(1)
        values[every] = self.clean_value
        if bool(none.any()):
            values[none] = self.empty_value
        todo = (~every & ~none).nonzero().flatten()
        batch = batch or self.copies_per_forward()
        for lo in range(0, todo.numel(), batch):
            rows = todo[lo:lo + batch]
            coeffs = self.graph.dense((~unique[rows]).to(self.delta.dtype))
            values[rows] = self.run_coeffs(coeffs)[0].cpu()
        return values[inverse]


#: the per-head input hooks of graph mode and the projection each feeds
_READS = {"hook_q_input": "q", "hook_k_input": "k", "hook_v_input": "v"}


class _HeadChanges:
    """What an exact edge patch adds at ``attn.hook_q/k/v`` when the model runs without
    per-head forks: ``(ln1(R + d_u) - ln1(R)) W[h]`` over the computed positions, ``R`` the
    clean residual entering the receiver's layer (a copy joins the staircase there, clean
    upstream), ``d_u`` the sender's ``edge_delta``; ``head`` None: every head (the metric
    at an attention input)."""

    def __init__(self, run: GraphRun, weights: dict[str, Tensor], first: int) -> None:
        self.run, self.weights, self.first = run, weights, first
        self.normed: dict[tuple[int, int], Tensor] = {}  # (layer, sender) -> ln1 change
        self.base: dict[int, tuple[Tensor, Tensor]] = {}  # layer -> (R, ln1(R))

    def of(self, kind: str, layer: int, sender: int, head: int | None) -> Tensor:
        key = (layer, sender)
        norm = block_norm(self.run.model, layer, "ln1")
        if layer not in self.base:
            resid = self.run.clean.acts[act_name("resid_pre", layer)][:, self.first:]
            self.base[layer] = resid, norm(resid)
        if key not in self.normed:
            resid, at_base = self.base[layer]
            d = self.run.edge_delta[:, self.first:, sender].to(resid.dtype)
            self.normed[key] = norm(resid + d) - at_base
        w = self.weights[kind][layer]
        if head is None:
            return torch.einsum("bpd,hde->bphe", self.normed[key], w)
        return self.normed[key] @ w[head]


def _grad_keeper(grads: dict[str, Tensor], name: str) -> HookFn:
    """A hook that stores the gradient reaching the hooked activation (when it has one)."""
    def hook(act: Tensor, hook: Any) -> None:
        if act.requires_grad:
            act.register_hook(lambda gr: grads.__setitem__(name, gr))
    return hook


class _CoeffHooks:
    """The hooks of one :meth:`GraphRun.run_coeffs` call: they collect what each sender writes
    as the run goes, and give each receiver slot its input plus ``sum_u C[u, v] * (w_u^corr -
    w_u^run)`` (only the senders with a non-zero coefficient into the slot in some copy)."""

    def __init__(self, run: GraphRun, coeffs: Tensor, with_grad: bool, keep_writes: bool,
                 grads: dict[str, Tensor], deltas: dict[str, Tensor]) -> None:
        self.run, self.coeffs = run, coeffs
        self.with_grad, self.keep_writes = with_grad, keep_writes
        self.grads, self.deltas = grads, deltas
        self.copies = coeffs.shape[0]
        # what senders wrote so far, in sender order: tensors [rows, pos, n, d_model], or
        # (layer, raw head results) turned into writes once the post-norm's scale is known
        self.written: list[Any] = [run.w_clean[:, :, :1].repeat(self.copies, 1, 1, 1)]
        self.scales: dict[int, Tensor] = {}
        self.posts: dict[int, Tensor] = {}
        # runs without gradients gather the writes once into a sender-major buffer
        # ``[copies, sender, batch * pos, d]`` (filled as senders write) and inject with two
        # matrix products per slot, never materialising ``w_corr - w_run`` per copy and slot
        self.buffered = not with_grad and not keep_writes
        self.buffer: Tensor | None = None
        self.filled = 0  # entries of ``written`` copied into the buffer
        self.flat_corr: Tensor | None = None  # ``w_corr`` as ``[sender, batch * pos * d]``
        # a block's q, k and v inputs read the same senders' writes: one product serves the
        # three (the buffer, the costly read, is read once): hook -> (the block's slots'
        # columns, this slot's place among them); the product kept until the next block's
        self.siblings: dict[str, tuple[list[int], slice]] = {}
        self.shared: tuple[tuple[int, ...], int, Tensor] | None = None

    def hooks(self) -> list[tuple[str, HookFn]]:
        run, out = self.run, []
        for layer in range(run.graph.n_layers):
            if run.post_norm:
                out.append((act_name("ln1_post.hook_scale", layer), self._on_scale(layer)))
            out.append((Sender("head", layer).write_hook, self._on_result(layer)))
            if layer in run.w_out:
                out.append((Sender("neuron", layer).hook, self._on_post(layer)))
            if run._has_mlp(layer):
                out.append((Sender("mlp", layer).write_hook, self._on_mlp(layer)))
        slots = run.slots()
        if self.buffered:
            self._group_siblings(slots)
        return out + [(s.hook, self._inject(s)) for s in slots]

    def _group_siblings(self, slots: list[Slot]) -> None:
        """Fill :attr:`siblings`: the per-head input slots of each block (q, k, v)."""
        blocks: dict[str, list[Slot]] = {}
        for slot in slots:
            if slot.heads and not slot.broadcast:
                blocks.setdefault(slot.hook.rsplit(".", 1)[0], []).append(slot)
        for group in blocks.values():
            cols = [c for slot in group for c in slot.cols]
            first = 0
            for slot in group:
                self.siblings[slot.hook] = (cols, slice(first, first + len(slot.cols)))
                first += len(slot.cols)

    def _slot_injection(self, n_s: int, slot: Slot) -> Tensor:
        """The slot's buffered injection, ``[copies * batch, pos, v, d]``: from the product
        its block's q, k and v share, computed by the first of them to fire."""
        if slot.hook not in self.siblings:
            return self._buffered_injection(n_s, slot.cols)
        cols, part = self.siblings[slot.hook]
        key = tuple(cols)
        if self.shared is None or self.shared[:2] != (key, n_s):
            self.shared = (key, n_s, self._buffered_injection(n_s, cols))
        return self.shared[2][:, :, part]

    def _entry(self, i: int) -> Tensor:
        """Entry ``i`` of ``written`` as writes (head results scaled once known)."""
        w = self.written[i]
        if isinstance(w, tuple):
            layer, res = w
            w = res / self.scales[layer].unsqueeze(-1) * self.run.norm_gain[layer]
            self.written[i] = w
        return w

    @staticmethod
    def _size(w: Any) -> int:
        return int((w[1] if isinstance(w, tuple) else w).shape[2])

    def _columns(self, idx: list[int]) -> Tensor:
        """The run's writes of senders ``idx`` (ascending), ``[rows, pos, len(idx), d]``,
        without concatenating every sender's write (most coefficients are often 0)."""
        out, first = [], 0
        for i, w in enumerate(self.written):
            size = self._size(w)
            sel = [j - first for j in idx if first <= j < first + size]
            if sel:
                out.append(self._entry(i)[:, :, sel])
            first += size
        return torch.cat(out, 2)

    def _fill(self) -> int:
        """Copy the writes not yet in the buffer into it; returns the senders written so far."""
        run, copies = self.run, self.copies
        b, pos, n_all, dm = run.delta.shape
        if self.buffer is None:
            self.buffer = run.delta.new_empty(copies, n_all, b * pos, dm)
            corr = run.w_corr
            self.flat_corr = corr.permute(2, 0, 1, 3).reshape(n_all, b * pos * dm)
        first = sum(self._size(self.written[i]) for i in range(self.filled))
        for i in range(self.filled, len(self.written)):
            w = self._entry(i)
            size = int(w.shape[2])
            self.buffer[:, first:first + size] = w.view(copies, b, pos, size, dm).permute(
                0, 3, 1, 2, 4).reshape(copies, size, b * pos, dm)
            first += size
        self.filled = len(self.written)
        return first

    def _buffered_injection(self, n_s: int, cols: list[int]) -> Tensor:
        """``sum_u C[c, u, v] (w_u^corr - w_u^run)`` over the first ``n_s`` senders, for the
        slot's columns ``cols``: ``[copies * batch, pos, v, d]`` (a view). The corrupted part
        is one product shared by every copy; the run's part one batched product over copies,
        subtracted in the same call."""
        assert self.buffer is not None and self.flat_corr is not None
        copies, b = self.copies, self.run.batch
        pos, dm = int(self.run.delta.shape[1]), int(self.run.delta.shape[3])
        v = len(cols)
        ct = self.coeffs[:, :n_s][:, :, cols].transpose(1, 2).to(self.buffer.dtype)
        corr = (ct.reshape(copies * v, n_s) @ self.flat_corr[:n_s]).view(copies, v, -1)
        run_w = self.buffer[:, :n_s].flatten(2)  # [copies, n_s, batch * pos * d]
        inj = torch.baddbmm(corr, ct, run_w, alpha=-1)  # [copies, v, batch * pos * d]
        return inj.view(copies, v, b, pos, dm).permute(0, 2, 3, 1, 4).flatten(0, 1)

    def _corr_minus(self, idx: list[int], run_w: Tensor) -> Tensor:
        """``w_corr - w_run`` of senders ``idx``, ``[copies * batch, pos, n, d]``: the
        corrupted writes broadcast over the copies (never repeated per copy)."""
        corr = self.run.w_corr[:, :, idx]
        view = run_w.view(self.copies, -1, *run_w.shape[1:])
        return (corr.unsqueeze(0) - view).flatten(0, 1)

    def _on_result(self, layer: int) -> HookFn:
        def hook(act: Tensor, hook: Any) -> None:
            self.written.append((layer, act) if self.run.post_norm else act)
        return hook

    def _on_scale(self, layer: int) -> HookFn:
        def hook(act: Tensor, hook: Any) -> None:
            self.scales[layer] = act
        return hook

    def _on_post(self, layer: int) -> HookFn:
        def hook(act: Tensor, hook: Any) -> None:
            self.posts[layer] = act
        return hook

    def _on_mlp(self, layer: int) -> HookFn:
        def hook(act: Tensor, hook: Any) -> None:
            self.written.append(self.run.mlp_writes(act, self.posts.get(layer), layer))
        return hook

    def _inject(self, slot: Slot) -> HookFn:
        copies, b = self.copies, self.run.batch
        # senders whose coefficient into this slot is non-zero in some copy: only their
        # differences are injected (EAP runs with all zero, EAP-IG on inputs with one)
        live = (self.coeffs[:, :, slot.cols] != 0).any(0).any(-1)

        def hook(act: Tensor, hook: Any) -> Tensor:
            if self.keep_writes:
                run_w = torch.cat([self._entry(i) for i in range(len(self.written))], 2)
                n_s = run_w.shape[2]
                d: Tensor | None = self._corr_minus(list(range(n_s)), run_w)
                idx = list(range(n_s))
            elif self.buffered:
                n_s = sum(self._size(w) for w in self.written)
                if not bool(live[:n_s].any()):
                    return act
                self._fill()
                inj = self._slot_injection(n_s, slot)
                new = act + (inj if slot.heads else inj[:, :, 0])
                return new if _own_copy(slot.hook) else write_in_place(act, new)
            else:
                n_s = sum(self._size(w) for w in self.written)
                idx = live[:n_s].nonzero().flatten().tolist()
                d = self._corr_minus(idx, self._columns(idx)) if idx else None
                if d is None and not self.with_grad:
                    return act
            # a tensor of its own: q, k and v may read one tensor, and each slot's
            # gradient must be its own reader's only
            new = act.view_as(act)
            if d is not None:
                c = self.coeffs[:, idx][:, :, slot.cols]  # [copies, u, v]
                inj = torch.einsum("cbsud,cuv->cbsvd",
                                   d.view(copies, b, *d.shape[1:]), c).flatten(0, 1)
                new = act + (inj if slot.heads else inj[:, :, 0])
            if self.with_grad:
                # the gradient hook holds the dict only: holding ``self`` (and so the writes it
                # keeps) closed a cycle through autograd's nodes that kept every run's graph
                grads = self.grads
                new.register_hook(lambda gr, name=slot.hook: grads.__setitem__(name, gr))
                if self.keep_writes:
                    assert d is not None
                    self.deltas[slot.hook] = d.detach()
                return new
            return new if _own_copy(slot.hook) else write_in_place(act, new)
        return hook
