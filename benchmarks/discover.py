"""Edge discovery on the full graph of smollm2-135m: EAP-IG against exact edge patching.

Not a timed test. Inputs: ``--n`` natural prompts of ``--seq-len`` tokens (with BOS); the
corrupted input of prompt i is prompt i+1 (rolled), the metric KL(clean || patched) of the
next-token distribution at the last position, so the graph is the whole model (every head,
MLP, the embedding and the logits). It prints:

- EAP-IG (``--steps``, on inputs) over every edge: wall time;
- plain EAP (one backward) over every edge: wall time, for reference;
- exact edge patching of a uniform random sample of ``--sample`` edges: time per edge,
  extrapolated to every edge (the cost of an edge depends on its receiver's layer, which the
  uniform sample covers in proportion);
- exact patching of EAP-IG's top ``--top`` edges, and Spearman/Pearson agreement of EAP-IG
  (and EAP) with it on those edges.

    .venv/bin/python benchmarks/discover.py [--model smollm2-135m] [--n 8] [--seq-len 32]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from mechsink import load_model
from mechsink.discover import GraphRun, eap, eap_ig
from mechsink.inputs.prompts import make_prompts
from mechsink.io import atomic_write_json
from mechsink.patching import KLToClean
from mechsink.patching.attribution import correlation


def say(text: str) -> None:
    """Progress as each phase ends (a slow machine still shows what it measured)."""
    print(text, flush=True)


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
    args = ap.parse_args()

    t0 = time.perf_counter()
    model = load_model(args.model, device="cpu")
    load_s = time.perf_counter() - t0
    tokens = make_prompts(model, "natural", "bos", n=args.n, seq_len=args.seq_len).tokens
    corrupted = tokens.roll(1, 0)

    t = time.perf_counter()
    run = GraphRun(model, tokens, KLToClean(-1), corrupted=corrupted)
    setup_s = time.perf_counter() - t
    g = run.graph
    say(f"setup (clean and corrupted runs, sender writes): {setup_s:.1f} s; "
        f"{g.n_edges} edges")
    t = time.perf_counter()
    ig = eap_ig(run, steps=args.steps, ig="inputs", verify=0)
    ig_s = time.perf_counter() - t
    say(f"EAP-IG ({args.steps} steps): {ig_s:.1f} s")
    t = time.perf_counter()
    plain = eap(run, qk_fix=False, verify=0)
    eap_s = time.perf_counter() - t
    say(f"EAP: {eap_s:.1f} s")

    gen = torch.Generator().manual_seed(args.seed)
    sample = torch.randperm(g.n_edges, generator=gen)[:args.sample].tolist()
    t = time.perf_counter()
    run.exact(sample)
    sample_s = time.perf_counter() - t
    per_edge = sample_s / len(sample)
    say(f"exact, {len(sample)} uniform edges: {sample_s:.1f} s ({per_edge:.2f} s per edge)")

    top = ig.order()[:args.top].tolist()
    t = time.perf_counter()
    exact_top = run.exact(top) - run.clean_value
    top_s = time.perf_counter() - t
    a_ig, a_eap = ig.values[top], plain.values[top]
    rows = {
        "model": args.model, "n": args.n, "seq_len": args.seq_len, "edges": g.n_edges,
        "senders": len(g.senders), "receivers": len(g.receivers), "load_s": load_s,
        "setup_s": setup_s, "eap_ig_steps": args.steps, "eap_ig_s": ig_s, "eap_s": eap_s,
        "exact_sample": len(sample), "exact_sample_s": sample_s, "exact_per_edge_s": per_edge,
        "exact_all_extrapolated_s": per_edge * g.n_edges, "exact_top_s": top_s,
        "top": args.top, "spearman_eap_ig_top": correlation(a_ig, exact_top, "spearman"),
        "pearson_eap_ig_top": correlation(a_ig, exact_top, "pearson"),
        "spearman_eap_top": correlation(a_eap, exact_top, "spearman"),
        "pearson_eap_top": correlation(a_eap, exact_top, "pearson"),
        "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
        "clean_kl": run.clean_value, "corrupted_kl": run.corrupted_value,
    }
    print(f"{args.model}: {args.n} prompts x {args.seq_len} tokens, {g.n_edges} edges "
          f"({len(g.senders)} senders, {len(g.receivers)} receivers), metric KL to clean at "
          f"the last position (corrupted = the next prompt); torch threads "
          f"{rows['torch_threads']}, {rows['cpus']} CPUs\n")
    print("| what | edges | wall s | s per edge |")
    print("|---|---|---|---|")
    print(f"| EAP-IG, {args.steps} steps (inputs) | all {g.n_edges} | {ig_s:.1f} | "
          f"{ig_s / g.n_edges:.2e} |")
    print(f"| EAP (one backward) | all {g.n_edges} | {eap_s:.1f} | {eap_s / g.n_edges:.2e} |")
    print(f"| exact, uniform sample | {len(sample)} | {sample_s:.1f} | {per_edge:.3f} |")
    print(f"| exact, all edges (extrapolated) | {g.n_edges} | {per_edge * g.n_edges:.0f} | "
          f"{per_edge:.3f} |")
    print(f"| exact, EAP-IG's top {args.top} | {args.top} | {top_s:.1f} | "
          f"{top_s / args.top:.3f} |\n")
    print(f"agreement with exact on EAP-IG's top {args.top}: EAP-IG Spearman "
          f"{rows['spearman_eap_ig_top']:.3f} (Pearson {rows['pearson_eap_ig_top']:.3f}); "
          f"EAP Spearman {rows['spearman_eap_top']:.3f} (Pearson {rows['pearson_eap_top']:.3f})")
    if args.out:
        atomic_write_json(args.out, rows)
        print(json.dumps({k: rows[k] for k in ("eap_ig_s", "exact_all_extrapolated_s")}))


if __name__ == "__main__":
    main()
