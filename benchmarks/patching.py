"""Patching speed on smollm2-135m: TransformerLens vs mechsink, and mechsink's efficiency.

Not a timed test. Same process, same ~15-token prompts. For each sweep it prints
TransformerLens's time (``transformer_lens.patching``: one full forward per patch), mechsink's
(best of three), their ratio, and mechsink's **efficiency**: the time the least work would
take at this machine's own throughput, divided by mechsink's time. Least work: the blocks
from the patched layer on, the positions from the patched one on (up to the last layer the
metric reads), and the unembedding of only the positions the metric reads. Throughput:
layer-tokens per second (and unembedded tokens per second) of one large batched forward,
measured just before and just after each sweep (the better of the two). The ratio to
TransformerLens depends on the CPU; efficiency is what carries across machines.

Sweeps: resid_pre by (layer, position) with ``LogitDiff`` and with a plain logit callable;
head z by (layer, position, head) on ``--z-layers``; resid_pre with ``SinkScore``; the P0-sink
path patches (every head and MLP of the first blocks, at position 0, position-mean ablated, to
the super neuron's MLP with two metrics in one run, and directly to the sink metric).
TransformerLens has no path patching: that row has no TransformerLens time. Then the speed
ideas one at a time (``--ideas``).

    .venv/bin/python benchmarks/patching.py [--model smollm2-135m] [--z-layers 0,15,29]
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import transformer_lens.patching as tlp

from mechsink import load_model
from mechsink.model import act_name, run_from_layer, to_tokens, unembed
from mechsink.patching import (
    LogitDiff,
    MassiveValue,
    SinkScore,
    activation_patch,
    engine,
    parse_component,
    parse_site,
    path_patch,
)

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"


def timed(fn):
    """(result, seconds) of one call."""
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def tl_cells(model, fn, corrupted, cache, metric, layers):
    """transformer_lens.patching over some layers (its index_df path), as [layer, ...]."""
    axes = fn.keywords["index_axis_names"]
    ranges = {"layer": layers, "pos": range(corrupted.shape[1]), "head": range(model.cfg.n_heads)}
    df = pd.DataFrame(list(itertools.product(*(ranges[a] for a in axes))), columns=list(axes))
    flat = tlp.generic_activation_patch(model, corrupted, cache, metric,
                                        fn.keywords["patch_setter"],
                                        fn.keywords["activation_name"], index_df=df)
    return flat.reshape(len(layers), *[len(ranges[a]) for a in axes[1:]])


def best_of(fn, n: int = 3):
    """(result, least seconds) of ``n`` calls: a shared machine's noise only slows a run."""
    out, times = None, []
    for _ in range(n):
        out, t = timed(fn)
        times.append(t)
    return out, min(times)


def throughput(model, seq_len: int, rows: int = 32) -> tuple[float, float]:
    """Layer-tokens per second of one large batched forward (blocks only) and unembedded
    tokens per second, best of two."""
    n_layers = int(model.cfg.n_layers)
    resid = torch.randn(rows, seq_len, int(model.cfg.d_model))
    final = engine.final_resid(model)
    blocks, heads = [], []
    for _ in range(2):
        _, t = timed(lambda: run_from_layer(model, resid, 0, stop_after={final}))
        blocks.append(rows * seq_len * n_layers / t)
        _, t = timed(lambda: unembed(model, resid))
        heads.append(rows * seq_len / t)
    return max(blocks), max(heads)


def least_work(cells, n_layers: int, seq_len: int, batch: int, *, read_layer: int | None,
               logit_positions: int, per_pos: bool = True) -> tuple[float, float]:
    """(layer-tokens, unembedded tokens) of the least work for patches at ``cells`` =
    [(layer, pos)]: blocks layer..read_layer (all with None), positions pos.., and the
    unembedding of ``logit_positions`` per patch (-1: every position from pos)."""
    lt, ut = 0.0, 0.0
    last = n_layers - 1 if read_layer is None else read_layer
    for layer, pos in cells:
        p = pos if per_pos else 0
        if layer <= last:
            lt += (last - layer + 1) * (seq_len - p) * batch
        if logit_positions:
            ut += batch * ((seq_len - p) if logit_positions < 0 else logit_positions)
    return lt, ut


@dataclass
class Bench:
    """What every sweep of the benchmark shares: the model, the prompt pair and its cache."""

    model: Any
    clean: torch.Tensor
    corrupted: torch.Tensor
    cache: Any
    john: int
    mary: int
    layers: list[int]  # the resid_pre sweeps' layers

    @property
    def seq_len(self) -> int:
        return int(self.clean.shape[1])

    def metric(self, logits: torch.Tensor) -> torch.Tensor:
        """The plain logit callable TransformerLens takes."""
        return logits[0, -1, self.john] - logits[0, -1, self.mary]

    def rate(self) -> tuple[float, float]:
        """Throughput now (the machine is shared: measured again before every sweep)."""
        lt_s, ut_s = throughput(self.model, self.seq_len)
        print(f"  throughput: {lt_s:,.0f} layer-tokens/s (blocks), {ut_s:,.0f} tokens/s "
              f"(unembedding), load average {os.getloadavg()[0]:.1f}", flush=True)
        return lt_s, ut_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--z-layers", default="0,15,29")
    ap.add_argument("--layers", default="all",
                    help="layers of the resid_pre sweeps, e.g. 0,15,29 on a busy machine")
    ap.add_argument("--p0-blocks", type=int, default=4)
    ap.add_argument("--p0-n", type=int, default=8)
    ap.add_argument("--p0-seq-len", type=int, default=16)
    ap.add_argument("--ideas", action="store_true", help="also time each speed idea alone")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    model = load_model(args.model, device="cpu")
    n_layers = int(model.cfg.n_layers)
    clean = to_tokens(model, CLEAN, prepend_bos=True)
    corrupted = to_tokens(model, CORRUPTED, prepend_bos=True)
    tok = model.tokenizer
    all_layers = list(range(n_layers)) if args.layers == "all" else [
        int(x) for x in args.layers.split(",")]
    print(f"model {args.model}: {n_layers} layers, prompt {clean.shape[1]} tokens, torch "
          f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f} at start")
    _, cache = model.run_with_cache(clean)
    model(corrupted)  # warm-up
    b = Bench(model, clean, corrupted, cache, tok(" John")["input_ids"][0],
              tok(" Mary")["input_ids"][0], all_layers)
    which = "" if args.layers == "all" else f" (layers {args.layers})"
    rows = activation_sweeps(b, [int(x) for x in args.z_layers.split(",")], args.z_layers,
                             which)
    p0, row = p0_path_patches(b, args.p0_blocks, args.p0_n, args.p0_seq_len)
    print_table([*rows, row])
    if args.ideas:
        speed_ideas(b, p0)


def activation_sweeps(b: Bench, z_layers: list[int], z_text: str, which: str) -> list[tuple]:
    """The activation-patching sweeps against TransformerLens: one row each."""
    model, seq_len = b.model, b.seq_len
    n_layers = int(model.cfg.n_layers)
    mid = n_layers // 2
    diff_metric = LogitDiff(b.john, b.mary)
    cells = [(lay, p) for lay in b.layers for p in range(seq_len)]
    z_cells = [(lay, p) for lay in z_layers for p in range(seq_len)
               for _ in range(int(model.cfg.n_heads))]
    sweeps = [
        (f"resid_pre x pos{which}, LogitDiff", "resid_pre", b.layers, diff_metric,
         tlp.get_act_patch_resid_pre, least_work(cells, n_layers, seq_len, 1, read_layer=None,
                                                 logit_positions=1)),
        (f"resid_pre x pos{which}, logit callable", "resid_pre", b.layers, b.metric,
         tlp.get_act_patch_resid_pre, least_work(cells, n_layers, seq_len, 1, read_layer=None,
                                                 logit_positions=-1)),
        (f"z x pos x head (layers {z_text}), LogitDiff", "z", z_layers, diff_metric,
         tlp.get_act_patch_attn_head_out_by_pos,
         least_work(z_cells, n_layers, seq_len, 1, read_layer=None, logit_positions=1)),
        (f"resid_pre x pos{which}, SinkScore({mid})", "resid_pre", b.layers, SinkScore(mid),
         None, least_work(cells, n_layers, seq_len, 1, read_layer=mid, logit_positions=0)),
    ]
    rows = []
    for label, site, layers, m, fn, (lt, ut) in sweeps:
        # the machine's throughput and mechsink's time, each the best of several tries,
        # measured back to back (a VM's speed drifts by 20% over minutes)
        lt_s, ut_s = b.rate()
        res, t_ms = best_of(lambda site=site, layers=layers, m=m: activation_patch(
            model, b.clean, b.corrupted, parse_site(site, layers=layers), m))
        lt_2, ut_2 = b.rate()
        lt_s, ut_s = max(lt_s, lt_2), max(ut_s, ut_2)
        if fn is not None:
            ref, t_tl = timed(lambda fn=fn, layers=layers: tl_cells(
                model, fn, b.corrupted, b.cache, b.metric, layers))
        else:  # TransformerLens has no sink metric: its loop with the same hook
            ref, t_tl = timed(lambda: sink_loop(b, cells, mid))
        diff = (res.values - ref.double()).abs().max().item()
        best = lt / lt_s + ut / ut_s
        rows.append((label, res.values.numel(), t_tl, t_ms, best, diff))
        print(f"  {label}: TL {t_tl:.1f}s mechsink {t_ms:.2f}s least work {best:.2f}s "
              f"efficiency {best / t_ms:.2f} max|diff| {diff:.1e}", flush=True)
    return rows


def sink_loop(b: Bench, cells: list[tuple[int, int]], layer: int) -> torch.Tensor:
    """TransformerLens's way for a sink metric: one hooked forward per (layer, pos) patch."""
    model = b.model
    out = torch.zeros(len(b.layers), b.seq_len)
    name = act_name("pattern", layer)
    for lay, pos in cells:
        src = b.cache[act_name("resid_pre", lay)]

        def hook(act, hook, pos=pos, src=src):
            act[:, pos] = src[:, pos]
            return act

        with model.hooks(fwd_hooks=[(act_name("resid_pre", lay), hook)]):
            _, c = model.run_with_cache(b.corrupted, names_filter=name)
        out[b.layers.index(lay), pos] = c[name][:, :, :, 0].mean()
    return out


def p0_path_patches(b: Bench, p0_blocks: int, p0_n: int, p0_seq_len: int
                    ) -> tuple[Callable[[], Any], tuple]:
    """The P0-sink path patches (no TransformerLens counterpart): the call, and its row."""
    from mechsink.inputs.prompts import make_prompts
    from mechsink.interventions.readout import dominant_super_neuron

    model = b.model
    n_layers = int(model.cfg.n_layers)
    tokens = make_prompts(model, "natural", "bos", n=p0_n, seq_len=p0_seq_len).tokens
    sn = dominant_super_neuron(model, tokens)
    sn_layer, channel = sn.layer, sn.channel
    blocks = min(max(sn_layer + 1, p0_blocks), n_layers)
    comps = [f"L{lay}H{h}@0" for lay in range(blocks) for h in range(int(model.cfg.n_heads))]
    comps += [f"MLP{lay}@0" for lay in range(blocks)] + [f"L{sn_layer}N{sn.neuron}@0"]
    targets = sorted({min(sn_layer + k, n_layers - 1) for k in (2, 4, 6)})
    while len(targets) < 3:
        targets.append(targets[-1])
    sink = (1 / 3) * (SinkScore(targets[0]) + SinkScore(targets[1]) + SinkScore(targets[2]))
    channel_metric = MassiveValue(sn_layer, 0, channel)

    def p0():
        a = path_patch(model, tokens, None, comps, [f"MLP{sn_layer}"], [channel_metric, sink],
                       ablation="position_mean", batch_size=None)
        c = path_patch(model, tokens, None, comps, ["metric"], sink, ablation="position_mean",
                       batch_size=None)
        return a, c

    lt_s, _ = b.rate()
    _, t_p0 = best_of(p0, 2)
    lt_s = max(lt_s, b.rate()[0])
    b0, t = tokens.shape
    lt = 0
    for c in comps:
        f = parse_component(c).block
        to_mlp = (sn_layer - f + 1) + (targets[-1] - sn_layer + 1) if f <= sn_layer else 0
        lt += (to_mlp + targets[-1] - f + 1) * t * b0
    best = lt / lt_s
    print(f"  P0-sink: mechsink {t_p0:.2f}s least work {best:.2f}s efficiency {best / t_p0:.2f}")
    return p0, (f"P0-sink path patches ({len(comps)} senders, {b0}x{t} tokens)",
                len(comps) * 3, float("nan"), t_p0, best, float("nan"))


def print_table(rows: list[tuple]) -> None:
    print("\n| sweep | patches | TransformerLens (s) | mechsink (s) | ratio | least work (s) | "
          "efficiency | max abs diff |")
    print("|---|---|---|---|---|---|---|---|")
    for label, n, a, t, best, d in rows:
        tl = "n/a" if a != a else f"{a:.1f}"
        ratio = "n/a" if a != a else f"{a / t:.1f}x"
        dd = "n/a" if d != d else f"{d:.1e}"
        print(f"| {label} | {n} | {tl} | {t:.2f} | {ratio} | {best:.2f} | {best / t:.2f} | {dd} |")
    print(f"load average at end {os.getloadavg()[0]:.1f}")


def speed_ideas(b: Bench, p0: Callable[[], Any]) -> None:
    """Each speed idea switched off alone, then all of them (results must not change)."""
    def sweep() -> Any:
        return activation_patch(b.model, b.clean, b.corrupted, parse_site(
            "resid_pre", layers=b.layers), LogitDiff(b.john, b.mary))

    print("\nspeed ideas (resid_pre x pos, LogitDiff), each switched off alone:")
    for idea in engine.SPEEDUPS:
        engine.SPEEDUPS[idea] = False
        _, t = timed(sweep)
        engine.SPEEDUPS[idea] = True
        print(f"  without {idea}: {t:.2f}s")
    # every idea off: what one forward per patch group from the first block costs here
    for idea in engine.SPEEDUPS:
        engine.SPEEDUPS[idea] = False
    try:
        _, t_off = timed(sweep)
        (a_off, b_off), t_p0_off = timed(p0)
    finally:
        for idea in engine.SPEEDUPS:
            engine.SPEEDUPS[idea] = True
    (a_on, b_on), t_p0_on = timed(p0)
    pairs = [*zip(a_on, a_off, strict=True), (b_on, b_off)]  # a: one result per metric
    same = max((x.values - y.values).abs().max().item() for x, y in pairs)
    print(f"  every idea off: resid_pre x pos {t_off:.2f}s; P0-sink path patches "
          f"{t_p0_off:.2f}s against {t_p0_on:.2f}s with them ({t_p0_off / t_p0_on:.1f}x, "
          f"max|diff| {same:.1e})")


if __name__ == "__main__":
    main()
