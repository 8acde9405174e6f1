"""The memory budget derived from the machine (faked free memory), its override, and what
plans by it: the patching planner and edge discovery's refusal before any forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mechsink.discover import GraphRun
from mechsink.discover.memory import held_bytes
from mechsink.errors import BadInputError
from mechsink.model import memory
from mechsink.patching import LogitDiff, engine, plan

GiB, MiB = 2**30, 2**20


def _meminfo(tmp_path, monkeypatch, available_kib: int, total_kib: int | None = None,
             rss_kib: int = 0) -> None:
    """Fake the machine (``/proc/meminfo``) and this process's resident memory (``VmRSS``):
    by default a machine large enough that only MemAvailable counts."""
    total = 2 * available_kib + 32000000 if total_kib is None else total_kib
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {total} kB\nMemFree:         1000000 kB\n"
                    f"MemAvailable:   {available_kib} kB\nBuffers:          100 kB\n")
    status = tmp_path / "status"
    status.write_text(f"Name:\tpython\nVmHWM:\t{rss_kib} kB\nVmRSS:\t{rss_kib} kB\n")
    monkeypatch.setattr(memory, "MEMINFO", str(path))
    monkeypatch.setattr(memory, "SELF_STATUS", str(status))


def test_cpu_budget_is_a_quarter_of_available_memory(tmp_path, monkeypatch):
    _meminfo(tmp_path, monkeypatch, 8 * 2**20)  # 8 GiB available
    assert memory.free_memory("cpu") == 8 * GiB
    assert memory.derived_budget("cpu") == 2 * GiB
    _meminfo(tmp_path, monkeypatch, 100 * 2**10)  # 100 MiB: the floor
    assert memory.derived_budget("cpu") == memory.FLOOR == 256 * MiB
    _meminfo(tmp_path, monkeypatch, 1024 * 2**20)  # 1 TiB: the cap
    assert memory.derived_budget("cpu") == memory.CAP == 16 * GiB


def test_cpu_free_memory_leaves_out_what_this_process_holds(tmp_path, monkeypatch):
    """Weights memory-mapped from their files are clean file pages the kernel counts as
    available: measured, an 8B-shaped model in bfloat16 held 15.35 GiB on a 23.4 GiB machine
    that still reported 22.4 GiB available, and the budget taken from that (5.6 GiB) took
    edge discovery to a 22.2 GiB peak. What the process holds is not room for activations."""
    _meminfo(tmp_path, monkeypatch, 22 * 2**20, total_kib=24 * 2**20, rss_kib=15 * 2**20)
    assert memory.free_memory("cpu") == 9 * GiB  # 24 GiB less the 15 held, not 22
    assert memory.derived_budget("cpu") == 9 * GiB // 4
    _meminfo(tmp_path, monkeypatch, 3 * 2**20, total_kib=24 * 2**20, rss_kib=15 * 2**20)
    assert memory.free_memory("cpu") == 3 * GiB  # other programs' use: MemAvailable is less
    _meminfo(tmp_path, monkeypatch, 3 * 2**20, total_kib=24 * 2**20, rss_kib=30 * 2**20)
    assert memory.free_memory("cpu") == 0  # never negative
    assert memory.derived_budget("cpu") == memory.FLOOR


def test_free_memory_hands_back_freed_heap_before_reading(tmp_path, monkeypatch):
    """What the process has freed but the C allocator keeps is not held: measured on the
    8B-shaped model, a census and two patching runs left 1.5 GiB of freed heap resident, and
    counted as held it shrank the budget below what the edge discovery after them needed."""
    calls = []
    _meminfo(tmp_path, monkeypatch, 22 * 2**20, total_kib=24 * 2**20, rss_kib=15 * 2**20)
    status = tmp_path / "status"

    def fake_trim(pad: int) -> int:  # the allocator gives 2 GiB back
        calls.append(pad)
        status.write_text(f"Name:\tpython\nVmRSS:\t{13 * 2**20} kB\n")
        return 1

    monkeypatch.setattr(memory, "_malloc_trim", lambda: fake_trim)
    assert memory.free_memory("cpu") == 11 * GiB  # 24 GiB less the 13 held after handing back
    assert calls == [0]
    monkeypatch.setattr(memory, "_malloc_trim", lambda: None)  # another C library: as read
    _meminfo(tmp_path, monkeypatch, 22 * 2**20, total_kib=24 * 2**20, rss_kib=15 * 2**20)
    assert memory.release_freed_heap() is False
    assert memory.free_memory("cpu") == 9 * GiB


def _rss_anon() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("RssAnon"))


def test_release_freed_heap_shrinks_what_this_process_holds():
    """On glibc, heap freed in the middle of the arena stays resident until handed back."""
    if memory._malloc_trim() is None or not Path("/proc/self/status").is_file():
        pytest.skip("no glibc malloc_trim or no /proc here")
    keep, junk = [], []
    for i in range(100_000):  # 150 MB in malloc-sized blocks, every 50th kept
        (keep if i % 50 == 0 else junk).append(bytearray(1500))
    del junk
    held = _rss_anon()
    assert memory.release_freed_heap() is True
    assert held - _rss_anon() > 50 * MiB
    assert len(keep) == 2000


def test_cuda_budget_is_half_the_free_device_memory(monkeypatch):
    seen = []

    def fake_mem_get_info(device=None):
        seen.append(torch.device(device))
        return 6 * GiB, 24 * GiB

    monkeypatch.setattr(torch.cuda, "mem_get_info", fake_mem_get_info)
    assert memory.derived_budget("cuda:0") == 3 * GiB
    assert seen == [torch.device("cuda:0")]


def test_an_explicit_budget_wins_and_is_checked(gpt2_tiny, tmp_path, monkeypatch):
    _meminfo(tmp_path, monkeypatch, 8 * 2**20)
    assert memory.memory_budget(gpt2_tiny) == 2 * GiB  # a CPU model: the CPU's memory
    assert memory.memory_budget(gpt2_tiny, 12345) == 12345
    assert memory.memory_budget(gpt2_tiny, "3GiB") == 3 * GiB
    for bad in (0, -5, True, 1.5, "lots", "2 parsecs"):
        with pytest.raises(BadInputError, match="memory_budget|size"):
            memory.memory_budget(gpt2_tiny, bad)


@pytest.mark.parametrize(("text", "size"), [
    ("2GiB", 2 * GiB), ("512MiB", 512 * MiB), ("512mib", 512 * MiB), ("1.5 GiB", 3 * GiB // 2),
    ("1GB", 10**9), ("4096", 4096), ("64KiB", 65536)])
def test_sizes_are_read(text, size):
    assert memory.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "-1GiB", "2 XB", "0", "1e9"])
def test_bad_sizes_are_one_line_errors(text):
    with pytest.raises(BadInputError, match="--memory-budget"):
        memory.parse_size(text)


def test_the_planner_follows_the_free_memory(llama_tiny, tmp_path, monkeypatch):
    per = plan.bytes_per_copy(llama_tiny, 1, 64, 0, -1)
    _meminfo(tmp_path, monkeypatch, 4 * 2**10)  # 4 MiB free: the floor, 256 MiB
    floor = plan.copies_per_batch(llama_tiny, 1, 64, 0, -1, tokens_per_batch=10**9)
    assert floor == memory.FLOOR // per
    _meminfo(tmp_path, monkeypatch, 16 * 2**20)  # 16 GiB: 4 GiB of budget
    more = plan.copies_per_batch(llama_tiny, 1, 64, 0, -1, tokens_per_batch=10**9)
    assert more == 4 * GiB // per > floor
    assert plan.copies_per_batch(llama_tiny, 1, 64, 0, -1, memory_budget=3 * per,
                                 tokens_per_batch=10**9) == 3


CLEAN = "The cat sat on the mat because it was tired"
CORR = "The dog sat on the mat because it was hungry"


def test_discovery_over_the_budget_is_refused_before_any_forward(llama_tiny, monkeypatch):
    def no_forward(*args, **kwargs):
        raise AssertionError("a forward ran before the refusal")

    monkeypatch.setattr(engine, "setup", no_forward)
    with pytest.raises(BadInputError, match=r"would hold about .* over the memory budget of "
                       r"1 KiB: lower --n or --seq-len .* --memory-budget"):
        GraphRun(llama_tiny, CLEAN, LogitDiff(11, 12), corrupted=CORR, memory_budget="1KiB",
                 prepend_bos=True)


def test_discovery_within_the_budget_runs(llama_tiny):
    tokens = engine.as_tokens(llama_tiny, CLEAN, prepend_bos=True)
    n_senders = 1 + 2 * (int(llama_tiny.cfg.n_heads) + 1)
    need, one = held_bytes(llama_tiny, 1, tokens.shape[1], n_senders)
    assert one == tokens.shape[1] * n_senders * int(llama_tiny.cfg.d_model) * 4
    run = GraphRun(llama_tiny, CLEAN, LogitDiff(11, 12), corrupted=CORR, memory_budget=need,
                   prepend_bos=True)
    assert len(run.graph.senders) == n_senders
    assert run.memory_budget == need
    with pytest.raises(BadInputError, match="over the memory budget"):
        GraphRun(llama_tiny, CLEAN, LogitDiff(11, 12), corrupted=CORR, memory_budget=need - 1,
                 prepend_bos=True)


def test_measure_forward_chunks_within_the_budget(gpt2_tiny, monkeypatch):
    from mechsink.measure import sink_scores
    from mechsink.measure.forward import bytes_per_sequence, measure_forward, of_cache

    tokens = torch.randint(1, 1000, (6, 10), generator=torch.Generator().manual_seed(0))
    wanted = {"s": of_cache(("attn.hook_pattern",), lambda cache: sink_scores(cache, 0))}
    sizes: list[int] = []
    real = gpt2_tiny.run_with_cache

    def counted(chunk, **kw):
        sizes.append(int(chunk.shape[0]))
        return real(chunk, **kw)

    monkeypatch.setattr(gpt2_tiny, "run_with_cache", counted)
    whole = measure_forward(gpt2_tiny, tokens, wanted, memory_budget="1GiB")["s"]
    assert sizes == [6]
    per = bytes_per_sequence(gpt2_tiny, [f"blocks.{i}.attn.hook_pattern" for i in range(2)],
                             10, False)
    sizes.clear()
    parts = measure_forward(gpt2_tiny, tokens, wanted, batch_size=4, memory_budget=2 * per)["s"]
    assert sizes == [2, 2, 2]
    torch.testing.assert_close(parts.gu, whole.gu, rtol=0, atol=1e-6)


@pytest.mark.parametrize("command", [
    ["discover", "no-such-model", "--metric", "sink_score:1"],
    ["patch", "no-such-model", "--clean", "a b", "--corrupted", "c d", "--metric",
     "sink_score:1"]])
def test_a_bad_memory_budget_is_refused_before_loading(tmp_path, command):
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    result = CliRunner().invoke(app, [*command, "--out", str(tmp_path / "o"),
                                      "--memory-budget", "lots"])
    assert result.exit_code == 2 and "--memory-budget" in result.output, result.output


def test_discover_over_the_budget_is_one_line_before_scoring(tmp_path):
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    result = CliRunner().invoke(app, [
        "discover", "random:llama-tiny", "--metric", "massive_value:1:0:3", "--method", "eap",
        "--n", "2", "--seq-len", "6", "--out", str(tmp_path / "o"), "--memory-budget", "4KiB"])
    assert result.exit_code == 2, result.output
    assert "over the memory budget of 4 KiB" in result.output
    assert "--memory-budget" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o" / "discover.json").exists()
