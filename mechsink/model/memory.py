"""The memory budget: how many bytes of activations one call may hold, from what the device has.

Every memory-hungry path (the patching planner's stacked copies, discovery's per-sender
tensors, the census chunks, the readout under edits) sizes its work by one number,
:func:`memory_budget`: an explicit ``memory_budget=`` (``--memory-budget 2GiB``) when given,
otherwise a fraction of what the model's device has free once the model is loaded:

- CPU: :data:`CPU_FRACTION` of the kernel's ``MemAvailable`` (``/proc/meminfo``; psutil
  where there is no such file), but never more than ``MemTotal`` less this process's resident
  memory: weights loaded in their own dtype stay memory-mapped from their files, and the
  kernel counts such clean file pages as available, so an 8B-shaped model in bfloat16 (15.4
  GiB resident on a 23.4 GiB machine) left 22.4 GiB "available" and a budget that took the
  run to 22.2 GiB. Before reading, the C allocator hands back to the kernel what this process
  has freed but still holds (glibc's ``malloc_trim``): earlier steps' activations, freed,
  would otherwise count as held (1.5 GiB after a census and two patching runs on that model,
  enough to refuse the edge discovery that followed). A quarter: the planners count the
  activations of one forward, not the
  allocator's slack, autograd's saved tensors or the other programs that share the machine
  meanwhile;
- CUDA: :data:`CUDA_FRACTION` of ``torch.cuda.mem_get_info``'s free bytes: the device is
  usually this process's own, but the caching allocator fragments and cuBLAS needs workspace;

never below :data:`FLOOR` (a nearly full machine still runs one copy at a time rather than
being refused everything) nor above :data:`CAP` (more copies than that no longer make a
forward faster, and one allocation of tens of GB is what a transient spike elsewhere turns
into an out-of-memory kill).
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable
from typing import Any

import torch

from mechsink.errors import BadInputError

MiB, GiB = 2**20, 2**30
CPU_FRACTION = 0.25
CUDA_FRACTION = 0.5
FLOOR = 256 * MiB
CAP = 16 * GiB
#: where the kernel says how much memory it can give without swapping
MEMINFO = "/proc/meminfo"
#: where it says how much of it this process holds (``VmRSS``)
SELF_STATUS = "/proc/self/status"

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 2**10, "mib": MiB, "gib": GiB,
          "tib": 2**40}


def _kib_fields(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """``name: N kB`` lines of a ``/proc`` file, in bytes (those it has; none when unreadable)."""
    out: dict[str, int] = {}
    try:
        with open(path, encoding="ascii") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in names and value.split():
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return out


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (None under another C library, or where none can be loaded)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim  # the C library this process already runs on
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed_heap() -> bool:
    """Hand back to the kernel the heap memory this process has freed but the C allocator
    still holds, so that what the process holds is what it uses; False where it cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def free_memory(device: torch.device | str | None = None) -> int | None:
    """Bytes the device has free now (None when it cannot be read): CUDA's free device
    memory, or the CPU's available memory (what the kernel can give without swapping), at
    most the machine's memory less what this process holds (its memory-mapped weights
    included, which the kernel counts as available; heap it has freed, handed back first)."""
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free)
    if dev.type != "cpu":
        return None
    release_freed_heap()
    machine = _kib_fields(MEMINFO, ("MemAvailable", "MemTotal"))
    if "MemAvailable" in machine:
        available, total = machine["MemAvailable"], machine.get("MemTotal")
        held = _kib_fields(SELF_STATUS, ("VmRSS",)).get("VmRSS")
    else:
        try:
            import psutil
        except ImportError:
            return None
        vm = psutil.virtual_memory()
        available, total = int(vm.available), int(vm.total)
        held = int(psutil.Process().memory_info().rss)
    if total is not None and held is not None:
        available = min(available, max(0, total - held))
    return int(available)


def derived_budget(device: torch.device | str | None = None) -> int:
    """The budget taken from what ``device`` has free (see the module's rules)."""
    dev = torch.device("cpu" if device is None else device)
    free = free_memory(dev)
    if free is None:
        return FLOOR
    fraction = CUDA_FRACTION if dev.type == "cuda" else CPU_FRACTION
    return int(min(CAP, max(FLOOR, fraction * free)))


def model_device(model: Any) -> torch.device:
    """Where ``model``'s weights are (CPU when it holds none)."""
    first = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    return first.device if first is not None else torch.device("cpu")


def check_budget(value: Any, what: str = "memory_budget") -> int:
    """A positive number of bytes: an int, or a size such as ``"2GiB"`` (:func:`parse_size`)."""
    if isinstance(value, str):
        return parse_size(value, what)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInputError(f"{what} must be a positive number of bytes (or a size such as "
                            f"'2GiB'), got {value!r}.")
    return value


def memory_budget(model: Any, budget: Any = None) -> int:
    """``budget`` when given (checked), else :func:`derived_budget` of ``model``'s device."""
    if budget is not None:
        return check_budget(budget)
    return derived_budget(model_device(model))


def parse_size(text: str, what: str = "--memory-budget") -> int:
    """Bytes from ``512MiB``, ``2GiB``, ``1.5GB`` or a plain number of bytes (binary units
    KiB/MiB/GiB/TiB, decimal KB/MB/GB/TB; case and a space before the unit do not matter)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise BadInputError(f"{what} must be a size such as 512MiB, 2GiB or a number of "
                            f"bytes, got {text!r}.")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value < 1:
        raise BadInputError(f"{what} must be at least one byte, got {text!r}.")
    return value


def format_size(n: int | float) -> str:
    """``n`` bytes for a message: ``1.5 GiB``, ``300 MiB``, ``12 KiB``."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"
