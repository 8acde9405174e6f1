"""`mechsink sweep`: a census over 8 random models, in this process vs on a local Ray instance.

Models: random:gpt2-mini and random:llama-mini, seeds 0-3 each (4 layers, d=256); census on the
three suites with BOS, n=8, T=64, one torch thread per shard. Reports the wall time of each run
(Ray's includes starting and stopping its local instance), their ratio, Ray's start+stop time
alone, and the per-shard overhead Ray adds: (Ray wall - start/stop - the busiest worker's
shard time) / shards. Also checks the two merged results are byte-identical.

    .venv/bin/python benchmarks/sweep.py [--workers 2] [--n 8] [--seq-len 64]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from mechsink.app.sweep import run_sweep


def merged(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.parts[len(out.parts)] not in ("shards", "summary.json")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="mechsink-bench-sweep-"))
    models = ", ".join(f'{{name = "random:{fam}-mini", seed = {s}}}'
                       for fam in ("gpt2", "llama") for s in range(4))
    (root / "spec.toml").write_text(
        f"models = [{models}]\njobs = [\"census\"]\nthreads = 1\n[census]\n"
        f"suites = [\"natural\", \"random\", \"repeated\"]\nvariants = [\"bos\"]\n"
        f"n = {args.n}\nseq_len = {args.seq_len}\n")

    t = time.perf_counter()
    local = run_sweep(root / "spec.toml", root / "local")
    local_wall = time.perf_counter() - t

    import ray

    t = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    ray.shutdown()
    ray_start_stop = time.perf_counter() - t

    t = time.perf_counter()
    remote = run_sweep(root / "spec.toml", root / "ray", ray=True, workers=args.workers)
    ray_wall = time.perf_counter() - t

    per_worker: dict[str, float] = {}
    for s in remote["shards"]:
        per_worker[s["worker"]] = per_worker.get(s["worker"], 0.0) + s["seconds"]
    shards = len(remote["shards"])
    overhead = (ray_wall - ray_start_stop - max(per_worker.values())) / shards
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores "
                   "(shared with other work while measured)",
        "models": 8, "n": args.n, "seq_len": args.seq_len, "workers": args.workers,
        "local_wall_s": round(local_wall, 2), "ray_wall_s": round(ray_wall, 2),
        "ray_over_local": round(ray_wall / local_wall, 3),
        "ray_start_stop_s": round(ray_start_stop, 2),
        "local_shard_s_sum": round(sum(s["seconds"] for s in local["shards"]), 2),
        "ray_shard_s_per_worker": {k: round(v, 2) for k, v in sorted(per_worker.items())},
        "ray_overhead_per_shard_s": round(overhead, 3),
        "failed": local["failed"] + remote["failed"],
        "identical_merged_results": merged(root / "local") == merged(root / "ray"),
    }
    print(json.dumps(result, indent=1))
    return 0 if result["identical_merged_results"] and not result["failed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
