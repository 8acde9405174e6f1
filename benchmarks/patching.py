"""TransformerLens's activation patching vs mechsink's, on smollm2-135m (not a timed test).

Same process, same inputs: ``resid_pre`` by position and head ``z`` by position with a logit
metric, checking agreement and printing times and ratios; then the speed ideas one at a time;
then the sink-metric sweep (a metric reading an attention pattern in a middle layer), against a
plain one-forward-per-patch loop. Head ``z`` sweeps TransformerLens over ``--z-layers`` only
(it is one forward per (layer, pos, head)); mechsink does the same cells.

    .venv/bin/python benchmarks/patching.py [--model smollm2-135m] [--z-layers 0,15,29]
"""

from __future__ import annotations

import argparse
import itertools
import time

import pandas as pd
import torch
import transformer_lens.patching as tlp

from mechsink import load_model
from mechsink.bridge import to_tokens
from mechsink.patching import LogitDiff, SinkScore, activation, activation_patch, parse_site

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--z-layers", default="0,15,29")
    ap.add_argument("--resid-layers", default="all")
    ap.add_argument("--batch-sizes", default="8,16,32,64")
    ap.add_argument("--sites", default="resid_pre,z", help="which TL comparisons to run")
    ap.add_argument("--sweep-layers", default="all",
                    help="layers of the batch-size, speed-idea and sink sweeps")
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    model = load_model(args.model, device="cpu")
    n_layers = model.cfg.n_layers
    clean = to_tokens(model, CLEAN, prepend_bos=True)
    corrupted = to_tokens(model, CORRUPTED, prepend_bos=True)
    tok = model.tokenizer
    john, mary = tok(" John")["input_ids"][0], tok(" Mary")["input_ids"][0]

    def metric(logits):
        return logits[0, -1, john] - logits[0, -1, mary]

    resid_layers = list(range(n_layers)) if args.resid_layers == "all" else [
        int(x) for x in args.resid_layers.split(",")]
    z_layers = [int(x) for x in args.z_layers.split(",")]
    sweep_layers = list(range(n_layers)) if args.sweep_layers == "all" else [
        int(x) for x in args.sweep_layers.split(",")]
    sweep_site = parse_site("resid_pre", layers=sweep_layers)
    print(f"model {args.model}: {n_layers} layers, prompt {clean.shape[1]} tokens, "
          f"torch threads {torch.get_num_threads()}")
    _, cache = model.run_with_cache(clean)
    model(corrupted)  # warm-up

    rows = []
    for label, site, fn, layers in [
        ("resid_pre by pos", "resid_pre", tlp.get_act_patch_resid_pre, resid_layers),
        ("head z by pos", "z", tlp.get_act_patch_attn_head_out_by_pos, z_layers),
    ]:
        if site not in args.sites.split(","):
            continue
        ref, t_tl = timed(lambda fn=fn, layers=layers: tl_cells(
            model, fn, corrupted, cache, metric, layers))
        res, t_ms = timed(lambda site=site, layers=layers: activation_patch(
            model, clean, corrupted, parse_site(site, layers=layers), metric))
        diff = (res.values - ref.double()).abs().max().item()
        rows.append((label, ref.numel(), t_tl, t_ms, t_tl / t_ms, diff))
        print(f"  {label}: TL {t_tl:.1f}s  mechsink {t_ms:.2f}s  ratio {t_tl / t_ms:.1f}x  "
              f"max|diff| {diff:.1e}", flush=True)

    print("\n| site | patches | TransformerLens (s) | mechsink (s) | ratio | max abs diff |")
    print("|---|---|---|---|---|---|")
    for label, n, a, b, r, d in rows:
        print(f"| {label} | {n} | {a:.1f} | {b:.2f} | {r:.1f}x | {d:.1e} |")

    # --- batch size tuning (resid_pre by pos, logit-diff metric reading only the last pos) ---
    print("\nbatch size (resid_pre by pos, LogitDiff):")
    ld = LogitDiff(john, mary)
    for bs in [int(x) for x in args.batch_sizes.split(",")]:
        _, t = timed(lambda bs=bs: activation_patch(model, clean, corrupted, sweep_site, ld,
                                                    batch_size=bs))
        print(f"  batch {bs:3d}: {t:.2f}s")

    # --- what each idea buys (resid_pre by pos, all layers) ---
    mid = n_layers // 2
    sink = SinkScore(mid)
    for label, m in [("TL-style logit metric", metric), ("LogitDiff (last position only)", ld),
                     (f"SinkScore({mid})", sink)]:
        print(f"\nspeed ideas (resid_pre by pos, {label}):")
        base = None
        for name, start, stop in [("batching only", False, False),
                                  ("+ start at patched layer", True, False),
                                  ("+ early stop / few-position unembed", True, True)]:
            activation.SPEEDUPS.update(start_at_patched_layer=start, early_stop=stop)
            res, t = timed(lambda m=m: activation_patch(model, clean, corrupted, sweep_site, m))
            base = res.values if base is None else base
            print(f"  {name:38s} {t:.2f}s  (max diff to first "
                  f"{(res.values - base).abs().max():.1e})", flush=True)
        activation.SPEEDUPS.update(start_at_patched_layer=True, early_stop=True)

    # --- sink-metric sweep vs a plain hook loop (one full forward per patch) ---
    print(f"\nsink-metric sweep (resid_pre by pos, layers {args.sweep_layers}, "
          f"SinkScore({mid})):")
    res, t_ms = timed(lambda: activation_patch(model, clean, corrupted, sweep_site, sink))

    def loop():
        out = torch.zeros(len(sweep_layers), clean.shape[1])
        name = f"blocks.{mid}.attn.hook_pattern"
        for (i, layer), pos in itertools.product(enumerate(sweep_layers), range(clean.shape[1])):
            src = cache[f"blocks.{layer}.hook_resid_pre"]

            def hook(act, hook, pos=pos, src=src):
                act[:, pos] = src[:, pos]
                return act

            with model.hooks(fwd_hooks=[(f"blocks.{layer}.hook_resid_pre", hook)]):
                _, c = model.run_with_cache(corrupted, names_filter=name)
            out[i, pos] = c[name][:, :, :, 0].mean()
        return out

    ref, t_loop = timed(loop)
    print(f"| sink-metric resid_pre by pos | {ref.numel()} | {t_loop:.1f} (hook loop) | "
          f"{t_ms:.2f} | {t_loop / t_ms:.1f}x | {(res.values - ref.double()).abs().max():.1e} |")


if __name__ == "__main__":
    main()
