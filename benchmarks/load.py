"""Load time and peak memory of a real zoo model: cold (decode the GGUF) vs warm (cached).

Each load runs in a fresh Python process so peak RSS is the load's own. "Cold" points
MECHSINK_CACHE at an empty temporary cache that shares only the downloaded GGUF (so the network
is not timed): the GGUF is decoded and converted. "Warm" loads the converted safetensors.

    python benchmarks/load.py [--model smollm2-135m] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import mechsink, transformers, transformer_lens.model_bridge  # library imports, timed apart
t1 = time.perf_counter()
mechsink.load_model(sys.argv[1], device="cpu")
t2 = time.perf_counter()
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "peak_mb": peak_mb}))
"""


def run_child(model: str, cache: Path) -> dict:
    env = dict(os.environ, MECHSINK_CACHE=str(cache), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", CHILD, model], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from mechsink import assets

    real_cache = assets.cache_dir()
    run_child(args.model, real_cache)  # make sure the GGUF is downloaded and the warm cache exists

    cold, warm = [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="mechsink-bench-") as tmp:
            (Path(tmp) / "assets").symlink_to(real_cache / "assets")
            cold.append(run_child(args.model, Path(tmp)))
        warm.append(run_child(args.model, real_cache))

    def row(name: str, runs: list[dict]) -> str:
        load = statistics.median(r["load_s"] for r in runs)
        peak = statistics.median(r["peak_mb"] for r in runs)
        return f"| {name} | {load:.2f} | {min(r['load_s'] for r in runs):.2f} | {peak:.0f} |"

    cold_s = statistics.median(r["load_s"] for r in cold)
    warm_s = statistics.median(r["load_s"] for r in warm)
    print(f"model {args.model}, {args.repeats} runs each, fresh process per run")
    print("| load | median s | min s | peak RSS MB |")
    print("|------|----------|-------|-------------|")
    print(row("cold (decode GGUF)", cold))
    print(row("warm (cached safetensors)", warm))
    print(f"warm load is {cold_s / warm_s:.1f}x faster than decoding the GGUF "
          f"(library imports, paid by both and not counted: "
          f"{statistics.median(r['import_s'] for r in warm):.2f} s)")


if __name__ == "__main__":
    main()
