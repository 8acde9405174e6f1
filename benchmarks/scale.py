"""Time and peak memory of every entry point on a model of Llama-3-8B's shapes, in bfloat16.

Not a test. Writes (once, reused after) a fresh model with Llama-3-8B's shapes (32 layers,
d_model 4096, 32 query / 8 key-value heads, d_mlp 14336, vocabulary 128,256, RoPE theta 500000,
RMSNorm; 16 GB of bfloat16 weights) as an ``hf:`` folder with
:func:`mechsink.model.zoo.random_folder.write_random_hf_folder`, then in one process: loads it
with ``dtype="bfloat16"``, and runs the steps a researcher runs first:

- ``scan``: the census of ``mechsink scan --n 8 --seq-len 64`` (every suite and variant);
- ``patch``: activation patching of ``resid_pre`` at every layer and the last 8 positions of
  an IOI prompt pair, with the logit difference;
- ``path``: path patching of every layer-0 and layer-1 head at position 0 (position-mean
  ablated) through MLP 1 to the massive-value metric of layer 1's largest channel at position 0;
- ``eap``: EAP on the full graph, 4 natural prompts of 32 tokens, to the same metric (20 top
  edges re-patched exactly, no further exact fallback);
- ``dose``: one dose-response (12 doses, 8 prompts of 32 tokens) of layer 1's four largest
  neurons at position 0.

For each step: the memory budget derived just before it (what its planners read), wall
time, peak resident memory (the kernel's high-water mark ``VmHWM``, reset
before the step by writing 5 to ``/proc/self/clear_refs``, so each peak is the step's own), the
weights' own size and the overhead (peak minus weights). The process raises its own OOM score
first, so that a machine running out of memory kills this benchmark, not a neighbour. Linux
only. ``--layers`` runs a reduced depth (every other shape as the 8B model's).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/scale.py [--layers 4] [--folder DIR]
        [--steps load,scan,patch,path,eap,dose] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from census_memory import reset_peak, status  # benchmarks/census_memory.py: the same /proc reads

GiB = 2**30
STEPS = ("load", "scan", "patch", "path", "eap", "dose")
CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPTED = "When Mary and John went to the store, Mary gave a drink to"


def llama3_8b_config(layers: int = 32) -> Any:
    """Llama-3-8B's config (its shapes; the vocabulary's special ids set to GPT-2's end of text,
    the tokenizer the written folder holds), at ``layers`` blocks."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=8,
                       max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                       tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256)


def measured(name: str, fn: Callable[[], Any], weights: int, rows: list[dict]) -> Any:
    """Run one step; record its time and its own peak RSS; print the row at once."""
    from mechsink.model.memory import derived_budget

    gc.collect()
    budget = derived_budget("cpu")  # what the step's planners read (freed heap handed back)
    before = status("VmRSS")
    reset_peak()
    t = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t
    peak = status("VmHWM")
    row = {"step": name, "seconds": seconds, "rss_before": before, "budget": budget,
           "peak_rss": peak,
           "weights": weights, "overhead": peak - weights}
    rows.append(row)
    print(fmt(row), flush=True)
    return out


def fmt(row: dict) -> str:
    return (f"{row['step']:<8} {row['seconds']:>9.1f} s  peak {row['peak_rss'] / GiB:6.2f} GiB"
            f"  weights {row['weights'] / GiB:6.2f} GiB  overhead {row['overhead'] / GiB:+6.2f} "
            f"GiB  (RSS before {row['rss_before'] / GiB:5.2f} GiB, budget "
            f"{row['budget'] / GiB:4.2f} GiB)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--folder", default=None, help="where the model is written (default: a "
                    "folder per depth under the temporary directory, reused)")
    ap.add_argument("--steps", default=",".join(STEPS))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    steps = [s for s in args.steps.split(",") if s]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown or not steps:
        ap.error(f"--steps: choose among {','.join(STEPS)}, got {args.steps!r}")
    try:  # out of memory: the kernel kills this process first
        Path("/proc/self/oom_score_adj").write_text("1000")
    except OSError as exc:
        print(f"could not raise the OOM score: {exc}", file=sys.stderr)

    import torch

    from mechsink import load_model
    from mechsink.model.zoo.random_folder import INDEX, tensor_shapes, write_random_hf_folder

    rows: list[dict] = []
    folder = Path(args.folder or Path(tempfile.gettempdir()) / "mechsink-scale" /
                  f"llama3-8b-shapes-L{args.layers}")
    config = llama3_8b_config(args.layers)
    print(f"model: Llama-3-8B shapes, {args.layers} layers, bfloat16, in {folder}; "
          f"torch threads {torch.get_num_threads()}", flush=True)
    size = 2 * sum(math.prod(s) for s in tensor_shapes(config).values())  # bfloat16 bytes
    if not (folder / INDEX).is_file():
        measured("write", lambda: write_random_hf_folder(config, folder, "bfloat16"), size, rows)
    index_size = json.loads((folder / INDEX).read_text())["metadata"]["total_size"]
    if index_size != size:
        sys.exit(f"{folder} holds {index_size} bytes of weights, not {size}: delete it")

    ref = f"hf:{folder}"
    model = measured("load", lambda: load_model(ref, device="cpu", dtype="bfloat16"),
                     index_size, rows)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    rows[-1]["weights"], rows[-1]["overhead"] = weights, rows[-1]["peak_rss"] - weights
    for name, fn in workloads(model).items():
        if name in steps:
            measured(name, fn, weights, rows)
    print("\nstep        time       peak RSS   weights   overhead")
    for row in rows:
        print(fmt(row))
    if args.json:
        Path(args.json).write_text(json.dumps({"layers": args.layers, "rows": rows}, indent=1))


def workloads(model: Any) -> dict[str, Callable[[], Any]]:
    """Each step's call on the loaded model (inputs and the metric's channel chosen here, from
    one forward through the first two blocks: not timed)."""
    import torch

    from mechsink.discover import discover
    from mechsink.inputs.prompts import make_prompts
    from mechsink.interventions.dose import dose_response
    from mechsink.interventions.targets import neuron_set
    from mechsink.measure.census import census
    from mechsink.model import act_name, to_tokens
    from mechsink.patching import LogitDiff, MassiveValue, activation_patch, parse_site, path_patch

    tok = model.tokenizer
    clean = to_tokens(model, CLEAN, prepend_bos=True)
    corrupted = to_tokens(model, CORRUPTED, prepend_bos=True)
    t = clean.shape[1]
    ioi = LogitDiff(tok.encode(" Mary")[0], tok.encode(" John")[0])
    short = make_prompts(model, "natural", "bos", n=8, seq_len=32).tokens
    eap_tokens = short[:4]
    with torch.no_grad():  # layer 1's largest channel and neurons at position 0
        _, cache = model.run_with_cache(
            short, names_filter=[act_name("resid_post", 1), act_name("mlp_post", 1)],
            stop_at_layer=2)
    channel = int(cache[act_name("resid_post", 1)][:, 0].float().abs().mean(0).argmax())
    neurons = cache[act_name("mlp_post", 1)][:, 0].float().abs().mean(0).topk(4).indices
    del cache
    massive = MassiveValue(1, 0, channel)
    heads = [f"L{layer}H{h}@0" for layer in (0, 1) for h in range(int(model.cfg.n_heads))]
    return {
        "scan": lambda: census(model, n=8, seq_len=64, seed=0, batch_size=8),
        "patch": lambda: activation_patch(
            model, clean, corrupted, parse_site("resid_pre", positions=list(range(t - 8, t))),
            ioi),
        "path": lambda: path_patch(model, short, None, heads, ["MLP1"], massive,
                                   ablation="position_mean", batch_size=None),
        "eap": lambda: discover(model, eap_tokens, massive, ablation="position_mean",
                                positions=[0], method="eap", verify=20, max_exact=0),
        "dose": lambda: dose_response(model, short, neuron_set(
            model, 1, neurons.tolist(), channels=[channel])),
    }


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
