"""Accuracy next to speed: EAP and EAP-IG (inputs and activations, several step counts)
against exact edge patching, on a sink metric, with each method's time.

For each model (each in its own process: one real model per process): ``--n`` natural prompts
of ``--seq-len`` tokens with BOS, the metric the massive channel at position 0 after the block
that creates it (``massive_value:L:0:CH``, found by the census's
:func:`~mechsink.interventions.readout.massive_channel_sets`; ``--metric MODEL=SPEC`` sets it
by hand), each sender's position-0 write replaced by its mean over the later positions
(``position_mean``, as ``mechsink discover`` does by default). Then:

- exact edge patching of every edge of the graph (it stops at the metric's block, so the
  graph is small), or of ``--max-exact`` edges at most: the union of every method's top
  ``--top`` and a uniform sample;
- EAP, EAP-IG on inputs and on activations with each of ``--steps``, every one with AtP*'s QK
  fix (``qk_fix=True``, the default) and its first-order scores before the fix;
- for each, Spearman and Pearson correlation with the exact scores on the top ``--top``
  edges by exact |score| and on a uniform sample of ``--sample`` edges (seeded), and its time.

Say whether the machine was loaded (the load average is printed): times are relative.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/discover_agreement.py \
        [--models smollm2-135m gemma3-270m] [--n 4] [--seq-len 16] [--steps 5 10 20 50] \
        [--top 200] [--sample 100] [--out agreement.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from mechsink.io import atomic_write_json


def say(text: str) -> None:
    print(text, flush=True)


def one_model(model_name: str, metric_spec: str | None, n: int, seq_len: int,
              steps: list[int], top: int, sample: int, max_exact: int, seed: int,
              memory_budget: int | None = None) -> dict[str, Any]:
    """Every row of the table for one model (runs in this process)."""
    from mechsink import load_model
    from mechsink.discover import GraphRun, eap, eap_ig
    from mechsink.inputs.prompts import make_prompts
    from mechsink.interventions.readout import massive_channel_sets
    from mechsink.patching import MassiveValue, parse_metric
    from mechsink.patching.attribution import correlation

    model = load_model(model_name, device="cpu")
    tokens = make_prompts(model, "natural", "bos", n=n, seq_len=seq_len).tokens
    if metric_spec:
        metric = parse_metric(metric_spec, model, tokens)
    else:
        found = massive_channel_sets(model, tokens)
        metric = MassiveValue(found.creating_layer, 0, found.channel)
    run, setup_s = timed(lambda: GraphRun(model, tokens, metric, ablation="position_mean",
                                          positions=[0], prepend_bos=False,
                                          memory_budget=memory_budget))
    g = run.graph
    say(f"{model_name}: metric {metric.name} (clean {run.clean_value:.4g}), {g.n_edges} "
        f"edges; setup {setup_s:.1f} s; load average {os.getloadavg()[0]:.1f}")
    methods: list[tuple[str, int | None, Any]] = [("EAP", None, lambda: eap(run, verify=0))]
    for ig in ("inputs", "activations"):
        for k in steps:
            methods.append((f"EAP-IG {ig}", k, lambda ig=ig, k=k: eap_ig(
                run, steps=k, ig=ig, verify=0)))
    estimates = []
    for label, k, fn in methods:
        est, secs = timed(fn)
        estimates.append((label, k, est, secs))
        say(f"  {label}{'' if k is None else f' {k} steps'}: {secs:.1f} s")
    gen = torch.Generator().manual_seed(seed)
    if g.n_edges <= max_exact:
        scored = list(range(g.n_edges))
    else:  # every method's top edges and a uniform sample
        pick: set[int] = set(torch.randperm(g.n_edges, generator=gen)[:sample].tolist())
        for _, _, est, _ in estimates:
            pick |= set(est.order()[:top].tolist())
        scored = sorted(pick)
    exact, exact_s = timed(lambda: run.exact(scored) - run.clean_value)
    say(f"  exact, {len(scored)} edges: {exact_s:.1f} s")
    full = torch.full((g.n_edges,), float("nan"), dtype=torch.float64)
    full[scored] = exact
    idx = torch.tensor(scored)
    top_idx = idx[torch.argsort(exact.abs(), descending=True, stable=True)[:top]]
    gen = torch.Generator().manual_seed(seed)
    uniform = idx[torch.randperm(len(scored), generator=gen)[:sample]]
    rows = []
    for label, k, est, secs in estimates:
        row: dict[str, Any] = {"method": label, "steps": k, "time_s": secs}
        for name, values in (("qk_fixed", est.values), ("first_order", est.first_order)):
            for where, sel in (("top", top_idx), ("uniform", uniform)):
                for kind in ("spearman", "pearson"):
                    row[f"{name}_{where}_{kind}"] = correlation(values[sel], full[sel], kind)
        rows.append(row)
    rows.append({"method": "exact", "steps": None, "time_s": exact_s,
                 "edges": len(scored)})
    return {"model": model_name, "metric": metric.name, "clean_value": run.clean_value,
            "n_edges": g.n_edges, "exact_edges": len(scored), "setup_s": setup_s, "n": n,
            "seq_len": seq_len, "top": top, "sample": sample, "rows": rows,
            "load_average": os.getloadavg()[0], "torch_threads": torch.get_num_threads(),
            "memory_budget": memory_budget}


def timed(fn: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def table(results: list[dict[str, Any]]) -> str:
    """Markdown: one block per model, one row per method."""
    lines = []
    for res in results:
        lines += ["", f"{res['model']}: {res['metric']} (clean {res['clean_value']:.4g}), "
                  f"position_mean at position 0, {res['n']} x {res['seq_len']} tokens, "
                  f"{res['n_edges']} edges ({res['exact_edges']} patched exactly), setup "
                  f"{res['setup_s']:.1f} s, load average {res['load_average']:.1f}", "",
                  f"| method | steps | time s | top {res['top']}: Spearman / Pearson | "
                  f"uniform {res['sample']}: Spearman / Pearson | first order (no QK fix): "
                  "top / uniform Spearman |", "|---|---|---|---|---|---|"]
        for r in res["rows"]:
            if r["method"] == "exact":
                lines.append(f"| exact ({r['edges']} edges) | | {r['time_s']:.1f} | 1 / 1 | "
                             "1 / 1 | |")
                continue
            f = {k: (f"{v:.3f}" if isinstance(v, float) else "n/a") for k, v in r.items()}
            lines.append(
                f"| {r['method']} | {r['steps'] or ''} | {r['time_s']:.1f} | "
                f"{f['qk_fixed_top_spearman']} / {f['qk_fixed_top_pearson']} | "
                f"{f['qk_fixed_uniform_spearman']} / {f['qk_fixed_uniform_pearson']} | "
                f"{f['first_order_top_spearman']} / {f['first_order_uniform_spearman']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--metric", action="append", default=[],
                    help="MODEL=SPEC, e.g. gemma3-270m=massive_value:5:0:163")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=16)
    ap.add_argument("--steps", type=int, nargs="+", default=[5, 10, 20, 50])
    ap.add_argument("--top", type=int, default=200)
    ap.add_argument("--sample", type=int, default=100)
    ap.add_argument("--max-exact", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-budget", action="append", default=[],
                    help="MODEL=BYTES: the GraphRun's memory budget for that model (copies "
                         "stacked per forward); default mechsink's")
    ap.add_argument("--out", default=None, help="also write the numbers as JSON here")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: this model
    ap.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    specs = dict(m.split("=", 1) for m in args.metric)
    budgets = {k: int(v) for k, v in (m.split("=", 1) for m in args.memory_budget)}
    if args.one:
        res = one_model(args.one, specs.get(args.one), args.n, args.seq_len, args.steps,
                        args.top, args.sample, args.max_exact, args.seed,
                        budgets.get(args.one))
        Path(args.json).write_text(json.dumps(res))
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:  # one process per model: each frees its memory on exit
            out = Path(tmp) / f"{len(results)}.json"
            cmd = [sys.executable, __file__, "--one", name, "--json", str(out),
                   "--n", str(args.n), "--seq-len", str(args.seq_len), "--top", str(args.top),
                   "--sample", str(args.sample), "--max-exact", str(args.max_exact),
                   "--seed", str(args.seed), "--steps", *map(str, args.steps)]
            cmd += [x for m in args.metric for x in ("--metric", m)]
            cmd += [x for m in args.memory_budget for x in ("--memory-budget", m)]
            subprocess.run(cmd, check=True)
            results.append(json.loads(out.read_text()))
            print(table(results[-1:]), flush=True)  # each model's table as it ends
            if args.out:
                atomic_write_json(args.out, {"results": results})
    print("\nAll models:" + table(results))


if __name__ == "__main__":
    main()
