"""Fault injection: kill each writing command at random moments and check what it left on disk.

Each command runs as the console script would (a fresh ``python`` process running
``mechsink.app.cli:app``, offline, one thread) and gets a SIGKILL after a random delay. Per
command, one run first goes unkilled: it gives the command's wall time T and, for ``scan`` and
``patch``, a complete result folder to write over. Each kill then waits a delay drawn uniformly
from [0.3 T, 1.05 T] (the first 30% is Python and torch starting, where nothing is written;
the last 5% lets some runs finish), alternating between a fresh folder and the folder holding
the previous result. What must hold after every kill:

- ``scan``, ``patch`` (result sets of :func:`mechsink.io.result_set`): the folder is whole
  (:func:`mechsink.io.check_result_set` with full hashes: the previous set or the new one) or,
  for a fresh folder, absent (no manifest and no visible file; the hidden staging folder and
  lock of the dead process are cleaned up by the next run).
- ``train``: ``run.json`` is absent (and the folder holds at most what a first checkpoint
  leaves: ``step-N`` names and hidden temporary names, which a rerun restarts from) or is valid
  JSON whose every listed checkpoint is complete (``step-N/config.json``,
  ``step-N/model.safetensors``, ``step-N.optimizer.pt``), so ``--resume`` continues it.

It prints the kills tried, the folders checked and the inconsistent ones (goal: 0), per command
and in total; the exit status is 1 when any folder is inconsistent.

    python benchmarks/faults.py [--kills 4] [--seed 0] [--commands scan,patch,train] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENTRY = "import sys; sys.argv[0] = 'mechsink'\nfrom mechsink.app.cli import app\napp()"

COMMANDS: dict[str, list[str]] = {  # command -> its arguments before --out
    "scan": ["scan", "random:gpt2-tiny", "--n", "2", "--seq-len", "8", "--suite", "natural",
             "--variant", "bos", "--batch-size", "2", "--device", "cpu"],
    "patch": ["patch", "random:gpt2-tiny", "--clean", "When Mary and John went", "--corrupted",
              "When Mary and Anna went", "--metric", "log_prob:0", "--layers", "0",
              "--device", "cpu"],
    "train": ["train", "bb-llama-tiny", "--steps", "4"],
}


def _env() -> dict[str, str]:
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")


def run_whole(args: list[str], out: Path) -> float:
    """Run a command to the end; its wall seconds (it must succeed)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", ENTRY, *args, "--out", str(out)], env=_env(),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def run_killed(args: list[str], out: Path, delay: float) -> bool:
    """Start a command and SIGKILL it after ``delay`` s; True when it was killed (not done)."""
    proc = subprocess.Popen([sys.executable, "-c", ENTRY, *args, "--out", str(out)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        proc.kill()  # SIGKILL
        proc.wait()
        return True


def check_result_folder(folder: Path, fresh: bool) -> str | None:
    """None when ``folder`` is whole or (``fresh``) absent; else what is wrong."""
    from mechsink.errors import MechsinkError
    from mechsink.io import MANIFEST, check_result_set

    if fresh and not (folder / MANIFEST).exists():
        visible = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        visible = [n for n in visible if not n.startswith(".")]
        return f"no manifest but files {visible}" if visible else None
    try:
        check_result_set(folder, full=True)
    except MechsinkError as exc:
        return str(exc)
    return None


def check_run_folder(folder: Path) -> str | None:
    """None when a training run folder can be resumed or restarted; else what is wrong."""
    record = folder / "run.json"
    if not record.exists():
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        odd = [n for n in names if not n.startswith(".")
               and not re.fullmatch(r"step-\d+(\.optimizer\.pt)?", n)]
        return f"no run.json but {odd}" if odd else None
    try:
        run = json.loads(record.read_text(encoding="utf-8"))
    except ValueError as exc:
        return f"run.json is not JSON: {exc}"
    for step in run.get("checkpoints", []):
        for part in (f"step-{step}/config.json", f"step-{step}/model.safetensors",
                     f"step-{step}.optimizer.pt"):
            if not (folder / part).is_file():
                return f"checkpoint {step} listed but {part} missing"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=4, help="kills per command")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill delays")
    parser.add_argument("--commands", default=",".join(COMMANDS),
                        help=f"comma-separated, from {', '.join(COMMANDS)}")
    parser.add_argument("--work", type=Path, default=None, help="folder for the runs "
                        "(default: a temporary one, removed afterwards)")
    args = parser.parse_args()
    commands = [c for c in args.commands.split(",") if c]
    unknown = sorted(set(commands) - set(COMMANDS))
    if unknown or args.kills < 1:
        parser.error(f"unknown command {unknown}" if unknown else "--kills must be at least 1")
    rng = random.Random(args.seed)
    holder = None if args.work else tempfile.TemporaryDirectory(prefix="mechsink-faults-")
    work = args.work or Path(holder.name)  # type: ignore[union-attr]
    totals = {"kills": 0, "killed": 0, "checked": 0, "inconsistent": 0}
    print(f"kill delays uniform in [0.3 T, 1.05 T], seed {args.seed}; load average "
          f"{os.getloadavg()[0]:.1f}")
    print("| command | T s | kills tried | killed mid-run | folders checked | inconsistent |")
    print("|---------|-----|-------------|----------------|-----------------|--------------|")
    problems: list[str] = []
    for name in commands:
        base = work / name
        previous = base / "previous"
        wall = run_whole(COMMANDS[name], previous)
        row = {"kills": 0, "killed": 0, "checked": 0, "inconsistent": 0}
        for k in range(args.kills):
            over_previous = name != "train" and k % 2 == 1
            out = previous if over_previous else base / f"fresh-{k}"
            killed = run_killed(COMMANDS[name], out, rng.uniform(0.3 * wall, 1.05 * wall))
            row["kills"] += 1
            row["killed"] += killed
            wrong = (check_run_folder(out) if name == "train"
                     else check_result_folder(out, fresh=not over_previous))
            row["checked"] += 1
            if wrong is not None:
                row["inconsistent"] += 1
                problems.append(f"{name} {out}: {wrong}")
        for key in totals:
            totals[key] += row[key]
        print(f"| {name} | {wall:.1f} | {row['kills']} | {row['killed']} | {row['checked']} | "
              f"{row['inconsistent']} |")
    print(f"| **total** | | {totals['kills']} | {totals['killed']} | {totals['checked']} | "
          f"{totals['inconsistent']} |")
    for problem in problems:
        print("inconsistent:", problem)
    if holder is not None:
        holder.cleanup()
    return 1 if totals["inconsistent"] else 0


if __name__ == "__main__":
    sys.exit(main())
