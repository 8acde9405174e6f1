"""Where the census's memory goes: peak resident set size per phase of one census.

Loads MODEL once (the load's own peak is reported apart), then runs the census (n=8, T=64 and
every suite x variant by default) and reports, over the RSS held right after loading:

- the census's peak (the kernel's high-water mark, ``VmHWM``, reset after loading by writing 5
  to ``/proc/self/clear_refs``);
- the peak of each phase: building the weights the measurements read (the census context), each
  chunk's forward (``run_with_cache`` of the hooks read) and each measurement of a chunk's cache.

Linux only (``/proc``). Run one at a time on a loaded machine; RSS peaks are exact, timings not.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/census_memory.py [--model qwen2.5-0.5b]
        [--n 8] [--seq-len 64] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

GIB = 2**30


def status(field: str) -> int:
    """A ``/proc/self/status`` field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Reset the high-water mark to the current RSS (Linux 4.0+)."""
    Path("/proc/self/clear_refs").write_text("5")


class Phases:
    """Peak RSS per named phase (the largest over the phase's calls)."""

    def __init__(self) -> None:
        self.peak: dict[str, int] = {}

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            before = status("VmHWM")
            reset_peak()
            try:
                return fn(*args, **kwargs)
            finally:
                self.peak[name] = max(self.peak.get(name, 0), status("VmHWM"))
                # keep the census-wide high-water mark: the phase's reset lowered it
                self.peak["_census"] = max(self.peak.get("_census", 0), before,
                                           status("VmHWM"))

        return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--census-json", default=None,
                        help="also write the census's JSON here (to compare two versions)")
    args = parser.parse_args()

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # measure this checkout
    import torch

    from mechsink.measure import census as census_mod
    from mechsink.measure.registry import CENSUS_MEASUREMENTS
    from mechsink.model.zoo import load_model

    torch.set_num_threads(1)
    start_rss = status("VmRSS")
    model = load_model(args.model, device="cpu")
    loaded, load_peak = status("VmRSS"), status("VmHWM")
    phases = Phases()
    entries = [dataclasses.replace(e, measure=phases.wrap(e.name, e.measure))
               for e in CENSUS_MEASUREMENTS]
    model.run_with_cache = phases.wrap("forward", model.run_with_cache)
    real_context = census_mod.census_context
    census_mod.census_context = phases.wrap("context", real_context)
    reset_peak()
    try:
        result = census_mod.census(model, n=args.n, seq_len=args.seq_len,
                                   batch_size=args.batch_size, measurements=entries,
                                   progress=lambda *a: None)
    finally:
        census_mod.census_context = real_context
    peak = max(status("VmHWM"), phases.peak.pop("_census", 0))
    out = {
        "model": args.model, "code": str(Path(census_mod.__file__).parents[2]),
        "n": args.n, "seq_len": args.seq_len,
        "batch_size": args.batch_size, "runs": len(result.runs),
        "rss_before_load_gib": round(start_rss / GIB, 3),
        "rss_after_load_gib": round(loaded / GIB, 3),
        "load_peak_gib": round(load_peak / GIB, 3),
        "census_peak_gib": round(peak / GIB, 3),
        "census_peak_over_loaded_gib": round((peak - loaded) / GIB, 3),
        "phase_peak_over_loaded_gib": {k: round((v - loaded) / GIB, 3)
                                       for k, v in sorted(phases.peak.items(),
                                                          key=lambda kv: -kv[1])},
    }
    if args.census_json:
        Path(args.census_json).write_text(census_mod.census_json(result))
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
