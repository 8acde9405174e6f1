"""Edge discovery on the full graph of smollm2-135m: mechsink's time per method against the
least work that method needs, measured in the same process, and agreement with exact patching.

Not a timed test. Inputs: ``--n`` natural prompts of ``--seq-len`` tokens (with BOS); the
corrupted input of prompt i is prompt i+1 (rolled), the metric KL(clean || patched) of the
next-token distribution at the last position, so the graph is the whole model (every head,
MLP, the embedding and the logits).

For each method it prints mechsink's time, the **least work** at this machine's throughput
(measured just before the method, best of two) and the **efficiency** = least work / time:

- EAP: the clean and the corrupted forward + one forward/backward (gradients of the metric
  with respect to activations only); mechsink's time includes the setup (``GraphRun``);
- EAP-IG with k steps: those two forwards + k forward/backward passes (setup included); IG on
  activations (the default): k forward/backward passes per sender group, each from the group's
  own block (the embedding, then each layer's heads and MLP), counted in whole-model units;
- exact edge patching (a uniform sample, and EAP-IG's top ``--top``): for each edge, a
  forward from the receiver's layer over the positions the patch can change (from the first
  corrupted one; every position here), batched, plus the unembedding of the position the
  metric reads, at the layer-tokens/s and unembedded-tokens/s of one large batched forward.

- path patching, the P0 row (as ``p0_sink`` runs it): every head of blocks ``0..S`` and
  every MLP before ``S`` at position 0 (position_mean), through MLP ``S`` (the block whose
  super neurons make the massive channel) to the channel at position 0: per sender group
  the blocks from its own to ``S`` (step 1) and block ``S`` again (step 2), every position,
  batched; timed with the staircase and without it (one start per batch, no prefix reuse).

Then Spearman/Pearson of EAP and EAP-IG against exact patching on EAP-IG's top edges. Say
whether the machine was loaded (the load average is printed): the ratio is what carries.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/discover.py [--model smollm2-135m] \
        [--n 8] [--seq-len 32] [--steps 5] [--top 200] [--sample 100]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from mechsink import load_model
from mechsink.discover import GraphRun, eap, eap_ig
from mechsink.inputs.prompts import make_prompts
from mechsink.interventions.readout import massive_channel_sets
from mechsink.io import atomic_write_json
from mechsink.model import run_from_layer, unembed
from mechsink.patching import KLToClean, MassiveValue, engine, path_patch
from mechsink.patching.attribution import correlation


def say(text: str) -> None:
    """Progress as each phase ends (a slow machine still shows what it measured)."""
    print(text, flush=True)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def best(fn: Callable[[], Any], n: int = 2) -> float:
    """Least seconds of ``n`` calls (a shared machine's noise only slows a call)."""
    return min(timed(fn)[1] for _ in range(n))


class Rates:
    """This machine's throughput now, on the benchmark's own input: a plain forward, a
    forward/backward to the activations, layer-tokens/s and unembedded tokens/s."""

    def __init__(self, model: Any, tokens: torch.Tensor) -> None:
        self.model, self.tokens = model, tokens
        b, s = tokens.shape
        self.n_layers = int(model.cfg.n_layers)
        with torch.no_grad():
            self.forward_s = best(lambda: model(tokens))
        resid = torch.randn(b, s, int(model.cfg.d_model))
        self.fwd_bwd_s = best(lambda: self._fwd_bwd(resid))
        rows = torch.randn(max(16, b), s, int(model.cfg.d_model))
        final = engine.final_resid(model)
        with torch.no_grad():
            t = best(lambda: run_from_layer(model, rows, 0, stop_after={final}))
            self.layer_tokens_s = rows.shape[0] * s * self.n_layers / t
            self.unembed_tokens_s = rows.shape[0] * s / best(lambda: unembed(model, rows))

    def _fwd_bwd(self, resid: torch.Tensor) -> None:
        """Forward from the embedding output and backward to it (no weight gradients)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            p.requires_grad_(False)
        try:
            x = resid.clone().requires_grad_(True)
            logits = run_from_layer(self.model, x, 0)
            torch.autograd.grad(logits[:, -1].logsumexp(-1).sum(), [x])
        finally:
            for p in params:
                p.requires_grad_(True)

    def eap_ig(self, steps: int) -> float:
        """Least seconds of EAP (steps=1) or EAP-IG: two forwards + ``steps`` fwd/bwd."""
        return 2 * self.forward_s + steps * self.fwd_bwd_s

    def exact(self, run: GraphRun, edges: list[int]) -> float:
        """Least seconds of patching each edge alone: blocks from the receiver's layer over
        the positions from the first corrupted one, and the metric's one unembedded
        position, per edge and prompt."""
        g, b = run.graph, run.batch
        tokens = b * (run.seq_len - run.first_position)
        layer_tokens = sum((self.n_layers - g.receiver_layer(g.receivers[int(g.dst[e])]))
                           * tokens for e in edges)
        return layer_tokens / self.layer_tokens_s + len(edges) * b / self.unembed_tokens_s

    def path(self, blocks: list[int], receiver_layer: int, batch: int, seq_len: int) -> float:
        """Least seconds of path patching groups first touching ``blocks`` through a receiver
        in ``receiver_layer`` to a metric read right after it: step 1 runs blocks ``b..R``,
        step 2 block ``R``, every position."""
        layer_tokens = sum(receiver_layer - b + 2 for b in blocks) * batch * seq_len
        return layer_tokens / self.layer_tokens_s

    def line(self) -> str:
        return (f"throughput: forward {self.forward_s:.2f} s, forward/backward "
                f"{self.fwd_bwd_s:.2f} s, {self.layer_tokens_s:,.0f} layer-tokens/s, "
                f"{self.unembed_tokens_s:,.0f} unembedded tokens/s; load average "
                f"{os.getloadavg()[0]:.1f}")


def p0_rows(model: Any, tokens: torch.Tensor) -> list[dict[str, Any]]:
    """Path patching's P0 row, with and without the staircase (see the module doc)."""
    found = massive_channel_sets(model, tokens)
    channel, sn = found.channel, found.creating_layer
    n_heads = int(model.cfg.n_heads)
    senders = [f"L{lay}H{h}@0" for lay in range(sn + 1) for h in range(n_heads)]
    senders += [f"MLP{lay}@0" for lay in range(sn)]
    blocks = [int(x[1:].split("H")[0].split("@")[0]) if x.startswith("L")
              else int(x[3:].split("@")[0]) for x in senders]
    metric = MassiveValue(sn, 0, channel)
    rows = []
    for label, stair in (("staircase", True), ("one start per batch", False)):
        saved = dict(engine.SPEEDUPS)
        engine.SPEEDUPS["staircase"] = stair
        try:
            rates = Rates(model, tokens)
            say(rates.line())
            _, t = timed(lambda: path_patch(model, tokens, None, senders, [f"MLP{sn}"], metric,
                                            ablation="position_mean", batch_size=None))
        finally:
            engine.SPEEDUPS.update(saved)
        rows.append({"method": f"path patching P0 ({label}): {len(senders)} senders @0 -> "
                               f"MLP{sn} -> channel {channel}", "edges": len(senders),
                     "time_s": t, "least_s": rates.path(blocks, sn, *tokens.shape)})
        say(f"path patching P0, {label}: {t:.1f} s")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=200)
    ap.add_argument("--sample", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write the numbers as JSON here")
    ap.add_argument("--only-ig", action="store_true",
                    help="EAP-IG only (inputs and activations; no exact patching, no "
                         "agreement): the full-graph time on a larger model")
    args = ap.parse_args()

    model, load_s = timed(lambda: load_model(args.model, device="cpu"))
    tokens = make_prompts(model, "natural", "bos", n=args.n, seq_len=args.seq_len).tokens
    corrupted = tokens.roll(1, 0)
    say(f"{args.model}: {args.n} prompts x {args.seq_len} tokens, torch threads "
        f"{torch.get_num_threads()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at start")
    table: list[dict[str, Any]] = []

    rates = Rates(model, tokens)
    say(rates.line())
    run, setup_s = timed(lambda: GraphRun(model, tokens, KLToClean(-1), corrupted=corrupted))
    g = run.graph
    say(f"setup (clean and corrupted runs, sender writes): {setup_s:.1f} s; {g.n_edges} edges")
    plain, eap_s = timed(lambda: eap(run, qk_fix=False, verify=0))
    table.append({"method": "EAP (setup included)", "edges": g.n_edges,
                  "time_s": setup_s + eap_s, "least_s": rates.eap_ig(1)})
    say(f"EAP: {eap_s:.1f} s (+ setup {setup_s:.1f} s)")

    rates = Rates(model, tokens)
    say(rates.line())
    ig, ig_s = timed(lambda: eap_ig(run, steps=args.steps, ig="inputs", qk_fix=False,
                                               verify=0))
    table.append({"method": f"EAP-IG {args.steps} steps, inputs (setup included)",
                  "edges": g.n_edges, "time_s": setup_s + ig_s,
                  "least_s": rates.eap_ig(args.steps)})
    say(f"EAP-IG ({args.steps} steps): {ig_s:.1f} s (+ setup {setup_s:.1f} s)")

    # IG on activations (the default) moves one sender group at a time from its own block:
    # the embedding runs every block, each layer's heads and its MLP the blocks from theirs,
    # so its own least work is k fwd/bwd passes over that many blocks (in whole-model units)
    rates = Rates(model, tokens)
    say(rates.line())
    n_layers = int(model.cfg.n_layers)
    group_blocks = n_layers + sum(2 * (n_layers - layer) for layer in range(n_layers))
    ig_act, ig_act_s = timed(lambda: eap_ig(run, steps=args.steps, ig="activations",
                                            qk_fix=False, verify=0))
    table.append({"method": f"EAP-IG {args.steps} steps, activations (setup included)",
                  "edges": g.n_edges, "time_s": setup_s + ig_act_s,
                  "least_s": 2 * rates.forward_s
                  + args.steps * rates.fwd_bwd_s * group_blocks / n_layers})
    say(f"EAP-IG on activations ({args.steps} steps): {ig_act_s:.1f} s")

    if args.only_ig:
        print_table(args, g, table, load_s, setup_s)
        return

    gen = torch.Generator().manual_seed(args.seed)
    sample = torch.randperm(g.n_edges, generator=gen)[:args.sample].tolist()
    rates = Rates(model, tokens)
    say(rates.line())
    _, sample_s = timed(lambda: run.exact(sample))
    table.append({"method": "exact, uniform sample", "edges": len(sample), "time_s": sample_s,
                  "least_s": rates.exact(run, sample)})
    say(f"exact, {len(sample)} uniform edges: {sample_s:.1f} s")

    table += p0_rows(model, tokens)

    top = ig.order()[:args.top].tolist()
    rates = Rates(model, tokens)
    say(rates.line())
    exact_top, top_s = timed(lambda: run.exact(top) - run.clean_value)
    table.append({"method": f"exact, EAP-IG (inputs)'s top {args.top}", "edges": len(top),
                  "time_s": top_s, "least_s": rates.exact(run, top)})
    agree = {name: {kind: correlation(est.values[top], exact_top, kind)
                    for kind in ("spearman", "pearson")}
             for name, est in (("eap", plain), ("eap_ig", ig), ("eap_ig_act", ig_act))}
    for i, name in enumerate(("eap", "eap_ig", "eap_ig_act")):
        table[i]["agreement"] = agree[name]

    print_table(args, g, table, load_s, setup_s)


def print_table(args: argparse.Namespace, g: Any, table: list[dict[str, Any]], load_s: float,
                setup_s: float) -> None:
    """The table (Markdown) and, with ``--out``, the JSON."""
    print(f"\n{args.model}: {args.n} prompts x {args.seq_len} tokens, {g.n_edges} edges "
          f"({len(g.senders)} senders, {len(g.receivers)} receivers), metric KL to clean at "
          "the last position (corrupted = the next prompt)\n")
    print("| method | edges | time s | least work s | efficiency | agreement with exact "
          f"(top {args.top}: Spearman / Pearson) |")
    print("|---|---|---|---|---|---|")
    for row in table:
        row["efficiency"] = row["least_s"] / row["time_s"]
        a = row.get("agreement")
        ag = f"{a['spearman']:.3f} / {a['pearson']:.3f}" if a else ""
        print(f"| {row['method']} | {row['edges']} | {row['time_s']:.1f} | "
              f"{row['least_s']:.1f} | {row['efficiency']:.2f} | {ag} |")
    if args.out:
        atomic_write_json(args.out, {"model": args.model, "n": args.n,
                                     "seq_len": args.seq_len, "load_s": load_s,
                                     "setup_s": setup_s, "rows": table})
        print(json.dumps({r["method"]: round(r["efficiency"], 3) for r in table}))


if __name__ == "__main__":
    main()
