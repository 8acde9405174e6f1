"""Load time and peak memory of a real zoo model: cold (decode the GGUF) vs warm (cached).

Each load runs in a fresh Python process so peak RSS is the load's own. "Cold" points
MECHSINK_CACHE at an empty temporary cache that shares only the downloaded GGUF (so the network
is not timed): the GGUF is decoded and converted. "Warm" loads the converted safetensors.

Where the time goes (warm): the library imports (torch, transformers, TransformerLens's bridge,
mechsink) are timed one by one, and the load is split into the transformers model
(``from_pretrained``), the tokenizer (every load of it, TransformerLens's own included) and the
TransformerLens bridge (``wrap_hf``: building the bridge, compatibility mode, hook registry);
each phase is exclusive of the others, and whatever is left is "other".

Start-up (``--startup``, printed first): the wall time of ``mechsink --help`` and ``mechsink
models`` in a fresh process each (the command line's entry point, as the console script runs
it), and of a bare ``import mechsink``; the goal is under 1.5 s on a quiet machine.

    python benchmarks/load.py [--model smollm2-135m] [--repeats 3] [--warm-only] [--startup-only]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import functools, json, resource, sys, time
phases = {}
t = time.perf_counter()
for name in ("torch", "transformers", "transformer_lens.model_bridge", "mechsink"):
    __import__(name)
    now = time.perf_counter()
    phases["import " + name] = now - t
    t = now
import importlib, pkgutil, mechsink.model, transformers

stack = [0.0]  # time spent in timed calls nested in the current one (phases are exclusive)

def timed(label, fn):
    @functools.wraps(fn)
    def inner(*a, **k):
        t0 = time.perf_counter()
        stack.append(0.0)
        try:
            return fn(*a, **k)
        finally:
            spent = time.perf_counter() - t0
            nested = stack.pop()
            phases[label] = phases.get(label, 0.0) + spent - nested
            stack[-1] += spent
    return inner

for cls, label in ((transformers.AutoModelForCausalLM, "from_pretrained (model)"),
                   (transformers.AutoTokenizer, "tokenizer")):
    cls.from_pretrained = timed(label, cls.from_pretrained.__func__).__get__(cls)
wrapped = timed("bridge (wrap_hf, less the tokenizer)", mechsink.model.wrap_hf)
for info in pkgutil.walk_packages(mechsink.model.__path__, "mechsink.model."):
    mod = importlib.import_module(info.name)  # every module that calls wrap_hf by its own name
    if getattr(mod, "wrap_hf", None) is mechsink.model.wrap_hf:
        setattr(mod, "wrap_hf", wrapped)
t1 = time.perf_counter()
mechsink.load_model(sys.argv[1], device="cpu")
t2 = time.perf_counter()
import_s = sum(v for k, v in phases.items() if k.startswith("import "))
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"import_s": import_s, "load_s": t2 - t1, "peak_mb": peak_mb,
                  "phases": phases}))
"""


def run_child(model: str, cache: Path) -> dict:
    env = dict(os.environ, MECHSINK_CACHE=str(cache), HF_HUB_OFFLINE="1")
    out = subprocess.run([sys.executable, "-c", CHILD, model], env=env, check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


STARTUP = {  # what is timed -> the Python code a fresh process runs
    "import mechsink": "import mechsink",
    "mechsink --help": "import sys; sys.argv = ['mechsink', '--help']\n"
                       "from mechsink.app.cli import app\napp()",
    "mechsink models": "import sys; sys.argv = ['mechsink', 'models']\n"
                       "from mechsink.app.cli import app\napp()",
}


def time_startup(code: str) -> float:
    """Wall seconds of a fresh ``python -c code`` (its output discarded; it must succeed)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def startup(repeats: int) -> None:
    """Print the start-up table: median and min wall seconds per command, fresh processes."""
    print(f"start-up, {repeats} runs each, fresh process per run (load average "
          f"{os.getloadavg()[0]:.1f})")
    print("| command | median s | min s |")
    print("|---------|----------|-------|")
    for label, code in STARTUP.items():
        times = [time_startup(code) for _ in range(repeats)]
        print(f"| {label} | {statistics.median(times):.2f} | {min(times):.2f} |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm-only", action="store_true", help="skip the cold loads")
    parser.add_argument("--startup-only", action="store_true",
                        help="time only the start-up of the command line")
    args = parser.parse_args()

    startup(args.repeats)
    if args.startup_only:
        return

    from mechsink.model import assets

    real_cache = assets.cache_dir()
    run_child(args.model, real_cache)  # make sure the GGUF is downloaded and the warm cache exists

    cold, warm = [], []
    for _ in range(args.repeats):
        if not args.warm_only:
            with tempfile.TemporaryDirectory(prefix="mechsink-bench-") as tmp:
                (Path(tmp) / "assets").symlink_to(real_cache / "assets")
                cold.append(run_child(args.model, Path(tmp)))
        warm.append(run_child(args.model, real_cache))

    def row(name: str, runs: list[dict]) -> str:
        load = statistics.median(r["load_s"] for r in runs)
        peak = statistics.median(r["peak_mb"] for r in runs)
        return f"| {name} | {load:.2f} | {min(r['load_s'] for r in runs):.2f} | {peak:.0f} |"

    print(f"model {args.model}, {args.repeats} runs each, fresh process per run")
    print("| load | median s | min s | peak RSS MB |")
    print("|------|----------|-------|-------------|")
    if cold:
        print(row("cold (decode GGUF)", cold))
    print(row("warm (cached safetensors)", warm))
    warm_s = statistics.median(r["load_s"] for r in warm)
    if cold:
        cold_s = statistics.median(r["load_s"] for r in cold)
        print(f"warm load is {cold_s / warm_s:.1f}x faster than decoding the GGUF")
    print()
    print("Warm, where the time goes (median s; imports are paid once per process):")
    print("| phase | median s |")
    print("|-------|----------|")
    names = list(warm[0]["phases"])
    for name in names:
        print(f"| {name} | {statistics.median(r['phases'].get(name, 0.0) for r in warm):.2f} |")
    other = statistics.median(
        r["load_s"] - sum(v for k, v in r["phases"].items() if not k.startswith("import "))
        for r in warm)
    print(f"| other (load_model's own work) | {other:.2f} |")
    print(f"| **imports total** | {statistics.median(r['import_s'] for r in warm):.2f} |")
    print(f"| **load_model total** | {warm_s:.2f} |")


if __name__ == "__main__":
    main()
