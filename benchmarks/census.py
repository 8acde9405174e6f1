"""Time and peak memory of `mechsink scan MODEL` (default: smollm2-135m, n=32, T=64).

Runs the real command in a child process, so the numbers include Python start-up, imports,
model loading, the census, the figures and the pages. Peak memory is the child's peak resident
set size (``getrusage(RUSAGE_CHILDREN).ru_maxrss``). Target on CPU: under 3 GB.

    .venv/bin/python benchmarks/census.py [--model smollm2-135m] [--out DIR] [-- extra scan args]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_PEAK_GB = 3.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default=None, help="report folder (default: a temporary one)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("extra", nargs="*", help="more `mechsink scan` options, after --")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="mechsink-bench-census-"))
    cmd = [sys.executable, "-c", "from mechsink.app.cli import app; app()", "scan", args.model,
           "--out", str(out), "--device", args.device, *args.extra]
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=False)
    wall = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024 / 1e9
    result = {
        "command": ["mechsink", *cmd[3:]],
        "exit_code": proc.returncode,
        "wall_seconds": round(wall, 1),
        "peak_rss_gb": round(peak_gb, 3),
        "target_peak_gb": TARGET_PEAK_GB,
        "under_target": peak_gb < TARGET_PEAK_GB,
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or
                    platform.machine(), "cores": _cores()},
    }
    if proc.returncode == 0:
        (out / "benchmark.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return proc.returncode


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


if __name__ == "__main__":
    raise SystemExit(main())
