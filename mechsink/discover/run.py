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

Models with a norm after attention (Gemma's sandwich norms) write ``norm(sum of heads)``: a
head's write is then its share with the norm's scale taken from the run (``g * result_h /
scale``), which adds up to the block's write exactly; a corrupted head's write uses the scale
of the corrupted run. Edge patches on such models are exact for that decomposition, not for
recomputing the norm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from mechsink.discover.graph import Graph, MetricPoint, Receiver
from mechsink.errors import BadInputError
from mechsink.interventions.ablation import Ablation, as_ablation
from mechsink.model import act_name, hook_names, run_from_layer, write_in_place
from mechsink.names import explicit_bos
from mechsink.patching import engine
from mechsink.patching.engine import TokensLike
from mechsink.patching.metrics import ALL, Metric, Outputs, check_value

HookFn = Callable[..., Any]
_FLAGS = ("use_split_qkv_input", "use_attn_result", "use_hook_mlp_in")


@contextmanager
def graph_mode(model: Any) -> Iterator[None]:
    """Per-head q/k/v inputs, per-head results and ``hook_mlp_in`` on, restored on exit.

    These are the public switches TransformerLens's HookedTransformer and TransformerBridge
    share (``set_use_split_qkv_input`` etc.); they leave the model's outputs unchanged.
    """
    before = {f: bool(getattr(model.cfg, f, False)) for f in _FLAGS}
    try:
        try:
            model.set_use_split_qkv_input(True)
            model.set_use_attn_result(True)
            model.set_use_hook_mlp_in(True)
        except (AttributeError, NotImplementedError, ValueError) as exc:
            raise BadInputError(
                f"this model cannot give each head its own query/key/value input ({exc}); "
                "edge discovery needs TransformerLens's use_split_qkv_input."
            ) from exc
        yield
    finally:
        for flag, value in before.items():
            setter = getattr(model, f"set_{flag}", None)
            if setter is not None and bool(getattr(model.cfg, flag, False)) != value:
                setter(value)


def _own_copy(hook: str) -> bool:
    """Receiver inputs must be replaced, never written in place: the MLP's input aliases the
    residual stream, and a per-head fork with one (KV) head can be a view of it."""
    return hook.endswith(("hook_mlp_in", "_input"))


@dataclass
class _Slot:
    """Receivers read at one hook: the hook, the receivers' columns and head axis (or None)."""

    hook: str
    cols: list[int]
    heads: bool  # the activation has a head axis (q/k/v inputs)
    broadcast: bool = False  # one column for every head (the metric at an attention input)


class GraphRun:
    """One setup per call: tokens, metric, senders' clean and corrupted writes, the graph.

    ``corrupted``: counterfactual tokens (each sender's corrupted write is its write on that
    run), or ``ablation`` (:mod:`mechsink.interventions.ablation`: zero, batch_mean, position_mean,
    resample) of each sender's clean write. ``positions``: corrupt senders at these positions
    only (default all; ``position_mean`` needs them: it is the mean over the others).
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
        memory_budget: int | None = None,
    ) -> None:
        abl = as_ablation(ablation, mean="batch_mean", seed=seed)
        if (abl is None) == (corrupted is None):
            raise BadInputError("give either corrupted tokens or an ablation, not both and "
                                "not neither.")
        self.model = model
        self.ablation = abl
        self.memory_budget = memory_budget
        prepend_bos = explicit_bos(prepend_bos, clean, corrupted, where="GraphRun")
        tokens = engine.as_tokens(model, clean, prepend_bos=prepend_bos)
        corr_t = None if corrupted is None else engine.as_tokens(model, corrupted,
                                                                 prepend_bos=prepend_bos)
        if corr_t is not None:
            engine.check_pair(tokens, corr_t)
        self.tokens = tokens
        batch, seq_len = tokens.shape
        mask = torch.zeros(seq_len, dtype=torch.bool)
        if positions is None:
            if abl is not None and abl.kind == "position_mean":
                raise BadInputError("position_mean ablation is the mean over the positions not "
                                    "ablated: give positions=[...] (e.g. [0]).")
            mask[:] = True
        else:
            for p in positions:
                if not -seq_len <= p < seq_len:
                    raise BadInputError(f"position {p} is outside 0..{seq_len - 1}.")
                mask[p] = True
            if abl is not None and abl.kind == "position_mean" and bool(mask.all()):
                raise BadInputError("position_mean needs at least one position left alone.")
        self.positions = mask
        (self.metric,), self.needs = engine.prepare_metrics(model, metric, seq_len)
        self.graph = Graph.build(model, self.metric)
        self.post_norm = act_name("ln1_post.hook_scale", 0) in hook_names(model)
        g = self.graph
        names = set(engine.names_for(model, self.needs))
        names |= {act_name("resid_pre", layer) for layer in range(max(1, g.n_layers + 1))
                  if layer < int(model.cfg.n_layers)}
        names |= self._write_hooks(range(g.n_layers))
        names |= {act_name("pattern", layer) for layer in range(g.n_layers)}
        with torch.no_grad(), graph_mode(model):
            logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
            acts = dict(cache.cache_dict)
            self.clean = engine.Run(tokens, logits, acts, None)
            clean_out = engine.outputs_of(model, self.clean, self.needs)
            self.metric = self.metric.bind(clean_out)
            self.clean_value = float(check_value(self.metric(clean_out), "on the clean run",
                                                 self.metric))
            self.norm_gain = self._norm_gains(acts) if self.post_norm else {}
            self.w_clean = self._writes(acts)
            if corr_t is not None:
                _, c_cache = model.run_with_cache(corr_t, names_filter=lambda n: n in names)
                c_acts = dict(c_cache.cache_dict)
                w_corr = self._writes(c_acts)
                self.corrupted_value: float | None = float(check_value(self.metric(
                    engine.outputs_of(model, engine.Run(corr_t, _, c_acts, None), self.needs)),
                    "on the corrupted run", self.metric))
            else:
                assert abl is not None
                w_corr = torch.stack([abl.values(self.w_clean[:, :, u], mask)
                                      for u in range(len(g.senders))], 2)
                self.corrupted_value = None
        where = mask.to(w_corr.device).view(1, seq_len, 1, 1)
        self.w_corr: Float[Tensor, "batch pos sender d_model"] = torch.where(
            where, w_corr, self.w_clean)
        self.delta = self.w_corr - self.w_clean
        self.batch, self.seq_len = batch, seq_len

    # ---- what senders write ------------------------------------------------------------

    def _write_hooks(self, layers: Any) -> set[str]:
        out = {act_name("resid_pre", 0)}
        for layer in layers:
            out |= {act_name("result", layer), act_name("mlp_out", layer)}
            if self.post_norm:
                out |= {act_name(f"ln1_post.{x}", layer)
                        for x in ("hook_scale", "hook_normalized", "hook_out")}
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
        result = acts[act_name("result", layer)]
        if not self.post_norm:
            return result
        scale = acts[act_name("ln1_post.hook_scale", layer)]
        return result / scale.unsqueeze(-1) * self.norm_gain[layer]

    def _writes(self, acts: dict[str, Tensor]) -> Float[Tensor, "batch pos sender d_model"]:
        cols = [acts[act_name("resid_pre", 0)].unsqueeze(2)]
        for layer in range(self.graph.n_layers):
            cols.append(self.head_writes(acts, layer))
            if any(s.kind == "mlp" and s.layer == layer for s in self.graph.senders):
                cols.append(acts[act_name("mlp_out", layer)].unsqueeze(2))
        return torch.cat(cols, 2)

    # ---- where receivers read ----------------------------------------------------------

    def slots(self, layer_from: int = 0) -> list[_Slot]:
        """Every receiver hook from block ``layer_from`` on, in forward order."""
        g, out = self.graph, []
        by_key: dict[tuple[str, int], list[int]] = {}
        for i, r in enumerate(g.receivers):
            by_key.setdefault((r.kind, r.layer), []).append(i)
        for layer in range(layer_from, g.n_layers):
            for kind in ("q", "k", "v"):
                out.append(_Slot(act_name(f"hook_{kind}_input", layer),
                                 by_key[(kind, layer)], True))
            if (("mlp", layer)) in by_key:
                out.append(_Slot(act_name("hook_mlp_in", layer), by_key[("mlp", layer)], False))
        metric_col = [len(g.receivers) - 1]
        point = g.point
        if point.kind == "attn":
            out += [_Slot(act_name(f"hook_{k}_input", point.layer), metric_col, True, True)
                    for k in ("q", "k", "v")]
        else:
            out.append(_Slot(act_name("resid_post", point.layer), metric_col, False))
        return out

    def n_senders_before(self, r: Receiver) -> int:
        stage = self.graph.receiver_stage(r)
        return sum(1 for s in self.graph.senders if s.stage < stage)

    def start_layer(self, r: Receiver) -> int:
        return r.layer if r.kind != "metric" else self.graph.point.layer

    # ---- runs --------------------------------------------------------------------------

    def run_coeffs(
        self, coeffs: Float[Tensor, "copies sender receiver"], *, with_grad: bool = False,
        keep_writes: bool = False, pattern_layers: Sequence[int] = (),
    ) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor]]:
        """Run ``copies`` stacked forwards, copy ``c`` with edge coefficients ``coeffs[c]``.

        Returns the metric per copy ``[copies]``, and (``with_grad``, one copy only) the
        gradient of the metric at each receiver hook (and at ``pattern_layers``' attention
        patterns) and the senders' run deltas ``w_corr - w_run`` per hook (``keep_writes``).
        """
        g = self.graph
        copies = coeffs.shape[0]
        b = self.batch
        coeffs = coeffs.to(self.delta.dtype)
        # what senders wrote so far, in sender order: tensors [rows, pos, n, d_model], or
        # (layer, raw head results) turned into writes once the post-norm's scale is known
        written: list[Any] = [self.w_clean[:, :, :1].repeat(copies, 1, 1, 1)]  # embed
        grads: dict[str, Tensor] = {}
        deltas: dict[str, Tensor] = {}
        w_corr = self.w_corr.repeat(copies, 1, 1, 1)
        scales: dict[int, Tensor] = {}

        def entry(i: int) -> Tensor:
            """Entry ``i`` of ``written`` as writes (head results scaled once known)."""
            w = written[i]
            if isinstance(w, tuple):
                layer, res = w
                written[i] = w = res / scales[layer].unsqueeze(-1) * self.norm_gain[layer]
            return w

        def materialise() -> Tensor:
            return torch.cat([entry(i) for i in range(len(written))], 2)

        def on_result(layer: int) -> HookFn:
            def hook(act: Tensor, hook: Any) -> None:
                written.append((layer, act) if self.post_norm else act)
            return hook

        def on_scale(layer: int) -> HookFn:
            def hook(act: Tensor, hook: Any) -> None:
                scales[layer] = act
            return hook

        def on_mlp(layer: int) -> HookFn:
            def hook(act: Tensor, hook: Any) -> None:
                written.append(act.unsqueeze(2))
            return hook

        def columns(idx: list[int]) -> Tensor:
            """The run's writes of senders ``idx`` (ascending), ``[rows, pos, len(idx), d]``,
            without concatenating every sender's write (most coefficients are often 0)."""
            out, first = [], 0
            for i, w in enumerate(written):
                size = (w[1] if isinstance(w, tuple) else w).shape[2]
                sel = [j - first for j in idx if first <= j < first + size]
                if sel:
                    out.append(entry(i)[:, :, sel])
                first += size
            return torch.cat(out, 2)

        def n_written() -> int:
            return sum((w[1] if isinstance(w, tuple) else w).shape[2] for w in written)

        def inject(slot: _Slot) -> HookFn:
            # senders whose coefficient into this slot is non-zero in some copy: only their
            # differences are injected (EAP runs with all zero, EAP-IG on inputs with one)
            live = (coeffs[:, :, slot.cols] != 0).any(0).any(-1)

            def hook(act: Tensor, hook: Any) -> Tensor:
                if keep_writes:
                    run_w = materialise()
                    n_s = run_w.shape[2]
                    d = w_corr[:, :, :n_s] - run_w
                    idx = list(range(n_s))
                else:
                    n_s = n_written()
                    idx = live[:n_s].nonzero().flatten().tolist()
                    d = w_corr[:, :, idx] - columns(idx) if idx else None
                    if d is None and not with_grad:
                        return act
                # a tensor of its own: q, k and v may read one tensor, and each slot's
                # gradient must be its own reader's only
                new = act.view_as(act)
                if d is not None:
                    c = coeffs[:, idx][:, :, slot.cols]  # [copies, u, v]
                    inj = torch.einsum("cbsud,cuv->cbsvd",
                                       d.view(copies, b, *d.shape[1:]), c).flatten(0, 1)
                    new = act + (inj if slot.heads else inj[:, :, 0])
                if with_grad:
                    new.register_hook(lambda gr, name=slot.hook: grads.__setitem__(name, gr))
                    if keep_writes:
                        deltas[slot.hook] = d.detach()
                    return new
                return new if _own_copy(slot.hook) else write_in_place(act, new)
            return hook

        hooks: list[tuple[str, HookFn]] = []
        for layer in range(g.n_layers):
            if self.post_norm:
                hooks.append((act_name("ln1_post.hook_scale", layer), on_scale(layer)))
            hooks.append((act_name("result", layer), on_result(layer)))
            if any(s.kind == "mlp" and s.layer == layer for s in g.senders):
                hooks.append((act_name("mlp_out", layer), on_mlp(layer)))
        hooks += [(s.hook, inject(s)) for s in self.slots()]
        resid0 = self.clean.acts[act_name("resid_pre", 0)].repeat(copies, 1, 1)
        if with_grad:
            resid0 = resid0.detach().clone().requires_grad_(True)
        values, pattern_grads = self._forward(resid0, hooks, copies, with_grad,
                                              pattern_layers)
        if with_grad:
            grads.update(pattern_grads)
        return values, grads, deltas

    def _forward(self, resid0: Tensor, hooks: list[tuple[str, HookFn]], copies: int,
                 with_grad: bool, pattern_layers: Sequence[int] = ()
                 ) -> tuple[Tensor, dict[str, Tensor]]:
        """Forward from block 0 with ``hooks``; the metric per copy (and, with grad, its
        gradient pulled back to every hooked tensor)."""
        model = self.model
        captured: dict[str, Tensor] = {}
        final = engine.final_resid(model)
        wanted = set(self.needs.hooks) | ({final} if isinstance(self.needs.logits, tuple)
                                          else set())
        pat: dict[str, Tensor] = {}
        pgrads: dict[str, Tensor] = {}

        def cap(name: str) -> HookFn:
            def hook(act: Tensor, hook: Any) -> None:
                captured[name] = act
            return hook

        def cap_pattern(name: str) -> HookFn:
            def hook(act: Tensor, hook: Any) -> None:
                pat[name] = act
                if act.requires_grad:
                    act.register_hook(lambda gr: pgrads.__setitem__(name, gr))
            return hook

        all_hooks = list(hooks) + [(h, cap(h)) for h in sorted(wanted)]
        all_hooks += [(act_name("pattern", lay), cap_pattern(act_name("pattern", lay)))
                      for lay in pattern_layers]
        ctx = torch.enable_grad() if with_grad else torch.no_grad()
        with ctx, graph_mode(model):
            early = self.needs.logits != ALL
            logits = run_from_layer(model, resid0, 0, fwd_hooks=all_hooks,
                                    stop_after=tuple(sorted(wanted)) if early else ())
            positions = self.needs.logits if isinstance(self.needs.logits, tuple) else None
            if positions is not None:
                logits = engine.unembed(model, captured[final][:, list(positions)])
            b = self.batch
            vals = []
            for i in range(copies):
                sel = slice(i * b, (i + 1) * b)
                out = Outputs(self.seq_len, {h: captured[h][sel] for h in self.needs.hooks},
                              None if logits is None or self.needs.logits is None
                              else logits[sel], positions)
                v = self.metric(out)
                check_value(v.detach() if isinstance(v, Tensor) else v,
                            "on the edge-patched run", self.metric)
                vals.append(v)
            values = torch.stack([torch.as_tensor(v) for v in vals])
            if with_grad:
                torch.autograd.grad(values.sum(), [resid0], allow_unused=True)
        return values.detach().double(), pgrads

    # ---- exact edge patches ------------------------------------------------------------

    def exact(self, edges: Int[Tensor, " n"] | Sequence[int], *, batch_size: int | None = None
              ) -> Float[Tensor, " n"]:
        """Metric with each edge alone corrupted (the receiver reads the corrupted sender),
        one forward per batch of edges from the receiver's layer on."""
        g = self.graph
        edges = [int(e) for e in edges]
        out = torch.empty(len(edges), dtype=torch.float64)
        by_start: dict[int, list[int]] = {}
        for i, e in enumerate(edges):
            r = g.receivers[int(g.dst[e])]
            by_start.setdefault(self.start_layer(r), []).append(i)
        with torch.no_grad(), graph_mode(self.model):
            for start, idx in sorted(by_start.items()):
                per = batch_size or engine.copies_per_batch(
                    self.model, self.batch, self.seq_len, 0,
                    -1 if self.needs.logits == ALL else len(self.needs.logits or ()),
                    memory_budget=self.memory_budget)
                for lo in range(0, len(idx), per):
                    chunk = idx[lo:lo + per]
                    vals = self._exact_batch(start, [edges[i] for i in chunk])
                    out[chunk] = vals
        return out

    def _exact_batch(self, start: int, edges: list[int]) -> Tensor:
        g, b, n = self.graph, self.batch, len(edges)
        per_hook: dict[str, list[tuple[int, int | None, int]]] = {}
        for c, e in enumerate(edges):
            u, r = int(g.src[e]), g.receivers[int(g.dst[e])]
            for hook, head in self._receiver_sites(r):
                per_hook.setdefault(hook, []).append((c, head, u))

        def patch(items: list[tuple[int, int | None, int]]) -> HookFn:
            def hook(act: Tensor, hook: Any) -> Tensor:
                new = act.clone()
                for c, head, u in items:
                    rows = slice(c * b, (c + 1) * b)
                    if head is None:
                        new[rows] += self.delta[:, :, u].unsqueeze(2) if new.ndim == 4 \
                            else self.delta[:, :, u]
                    else:
                        new[rows, :, head] += self.delta[:, :, u]
                return new if _own_copy(hook.name) else write_in_place(act, new)
            return hook

        hooks = [(h, patch(items)) for h, items in per_hook.items()]
        resid = self.clean.acts[act_name("resid_pre", start)]
        vals = engine.run_patched(self.model, self.clean, [self.metric], self.needs, resid,
                                  start, n, hooks, context="on the edge-patched run")
        return torch.stack(vals[0])

    def _receiver_sites(self, r: Receiver) -> list[tuple[str, int | None]]:
        """(hook, head index or None for every head / no head axis) where ``r`` reads."""
        if r.kind in ("q", "k", "v"):
            return [(act_name(f"hook_{r.kind}_input", r.layer), r.index)]
        if r.kind == "mlp":
            return [(act_name("hook_mlp_in", r.layer), None)]
        point: MetricPoint = self.graph.point
        if point.kind == "attn":
            return [(act_name(f"hook_{k}_input", point.layer), None) for k in "qkv"]
        return [(act_name("resid_post", point.layer), None)]

    def all_corrupted_value(self) -> float:
        """The metric with every edge corrupted (the corrupted run, or the ablated model)."""
        ones = self.graph.valid.to(self.delta.dtype).unsqueeze(0)
        return float(self.run_coeffs(ones)[0][0])

    def copies_per_forward(self) -> int:
        """Edge-coefficient runs stacked per forward: at most 32, within the memory budget
        (each copy holds the senders' corrupted writes, what they write in the run, their
        difference and the injected inputs, ``[batch, pos, sender, d_model]`` each, besides
        its activations)."""
        budget = self.memory_budget or engine.DEFAULT_MEMORY_BUDGET
        per = 4 * self.delta.numel() * self.delta.element_size() + engine.bytes_per_copy(
            self.model, self.batch, self.seq_len, 0, -1)
        return max(1, min(32, budget // max(1, per)))

    def mask_values(self, keep: Bool[Tensor, "copies edge"], *, batch: int | None = None
                    ) -> Tensor:
        """Metric with every edge *outside* ``keep[c]`` corrupted, per row ``c`` (``batch``
        rows per forward; default :meth:`copies_per_forward`)."""
        batch = batch or self.copies_per_forward()
        out = []
        for lo in range(0, keep.shape[0], batch):
            rows = keep[lo:lo + batch]
            coeffs = self.graph.dense((~rows).to(self.delta.dtype))
            out.append(self.run_coeffs(coeffs)[0])
        return torch.cat(out)
