"""The atlas's experiment steps on one model: mechsink's time per step against the least work
that step needs, measured in the same process (as ``benchmarks/discover.py`` does for discovery).

Not a timed test. Settings are the atlas's: ``--seq-len`` tokens, ``--n-census`` sequences for
the census-type steps (the first-token table, the variance discrepancy, C7's random input) and
``--n`` prompts for the intervention steps. For each step it prints mechsink's time, the
**least work** (the forwards the step cannot avoid, at this machine's batched throughput: a
plain forward of ``--rows`` sequences through the blocks, no hooks and no unembedding, best of
two, measured at the start and at the end, the faster kept; for a step that reads the
next-token loss, TransformerLens's own ``model(tokens, return_type="loss")`` on the same rows,
which adds the final norm, the unembedding and the cross-entropy) and the **efficiency** =
least work / time:

- first-token table: one forward per applicable suite x first-token variant (``--n-census``);
- variance (C1): one forward on random and one on natural text (``--n-census``);
- set validation (C2): the clean run and two zeroings per super-neuron set;
- dose-response (C3): one forward per dose of the creating block's complete set, with the
  loss (every dose reads it);
- structural origin (C4): the clean run and one forward per (position k, intervention, dose);
- P0-sink circuit (C5): the blocks its runs go through, counted as they run (path patching
  from each sender's layer, every component ablated alone, the greedy circuit search, the
  channel's dose-response): every one of those runs is needed by its search, so the count is
  its least work and the efficiency measures the cost per forward;
- query-bias dose (C6), where the model has ``b_Q``: one forward per (part, dose), with the
  loss;
- C7 init structure: per random-init twin its build (timed here, counted as needed), one
  forward of the random input through the blocks and the unembedding of its last position at
  every depth (one call, timed here), plus one forward of the second input set.

With ``--before`` each changed step is also timed one forward per dose (the stacked path off:
:data:`mechsink.interventions.stacked.SPEEDUPS`), so the table shows before and after from the
same run. Say whether the machine was loaded (the load average is printed): the ratio is what
carries.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/experiments.py [--model smollm2-135m] \
        [--n 16] [--n-census 32] [--seq-len 64] [--positions 4 8 32] [--before] [--out F]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import torch
from discover import say, timed  # benchmarks/discover.py: the same progress line and timer

from mechsink import load_model
from mechsink.experiments import atlas, init_structure, p0_sink, query_bias_dose, structural_origin
from mechsink.inputs.prompts import SUITES, VARIANTS, make_prompts
from mechsink.interventions import chain
from mechsink.interventions.first_token import traced_prompts
from mechsink.interventions.readout import massive_channel_sets
from mechsink.interventions.set_validation import validate_sets
from mechsink.interventions.stacked import ROWS_PER_FORWARD, SPEEDUPS
from mechsink.io import atomic_write_json
from mechsink.measure.sinks import DEFAULT_EPS
from mechsink.model import cache_blocks, query_bias, unembed


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f}"


class Throughput:
    """Tokens per second of a plain batched forward (no hooks) of ``rows`` sequences: through
    the blocks (``best``: no final norm, no unembedding, what a readout needs at least) and
    through the whole model to the next-token loss (``best_loss``: TransformerLens's own
    ``return_type="loss"``, what a step that reads the loss needs at least)."""

    def __init__(self, model: Any, rows: int, seq_len: int) -> None:
        self.model = model
        gen = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, int(model.cfg.d_vocab), (rows, seq_len), generator=gen)
        self.best = self.best_loss = 0.0

    def measure(self) -> float:
        with torch.no_grad():
            for _ in range(2):
                _, t = timed(lambda: cache_blocks(self.model, self.tokens, []))
                self.best = max(self.best, self.tokens.numel() / t)
                _, t = timed(lambda: self.model(self.tokens, return_type="loss",
                                                loss_per_token=True))
                self.best_loss = max(self.best_loss, self.tokens.numel() / t)
        return self.best

    def seconds(self, tokens: int, loss: bool = False) -> float:
        return tokens / (self.best_loss if loss else self.best)


class BlockTokens:
    """Counts the tokens every block processes while installed (a forward pre-hook per block):
    a step's work in blocks, whatever layer its runs start at. ``forwards`` is that work in
    full forwards' worth of tokens."""

    def __init__(self, model: Any) -> None:
        self.model, self.count, self.handles = model, 0, []

    def __enter__(self) -> BlockTokens:
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            x = args[0] if args else next(iter(kwargs.values()))
            self.count += int(x.shape[0]) * int(x.shape[1])

        self.handles = [b.register_forward_pre_hook(hook, with_kwargs=True)
                        for b in self.model.blocks]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()

    @property
    def tokens(self) -> int:
        """The work in tokens of a full forward (block tokens / layers)."""
        return self.count // len(self.model.blocks)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=16, help="prompts of the intervention steps")
    ap.add_argument("--n-census", type=int, default=32, help="sequences of the census steps")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--positions", type=int, nargs="*", default=None,
                    help="C4's positions (default: the atlas's, 4, 8 and seq_len // 2)")
    ap.add_argument("--rows", type=int, default=ROWS_PER_FORWARD,
                    help="sequences of the plain forward that sets the throughput")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--before", action="store_true",
                    help="also time the changed steps one forward per dose")
    ap.add_argument("--skip", nargs="*", default=[], help="steps to leave out (by key)")
    ap.add_argument("--out", default=None, help="also write the numbers as JSON here")
    args = ap.parse_args()

    model, load_s = timed(lambda: load_model(args.model, device="cpu"))
    n, nc, t_len, bs = args.n, args.n_census, args.seq_len, args.batch_size
    say(f"{args.model}: loaded in {load_s:.1f} s; n={n} (interventions), n={nc} (census), "
        f"T={t_len}; torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, {load()}")
    rate = Throughput(model, args.rows, t_len)
    say(f"plain forward of {args.rows} x {t_len}: {rate.measure():,.0f} tokens/s through the "
        f"blocks, {rate.best_loss:,.0f} to the loss ({load()})")

    variant, _, traced = traced_prompts(model, n, t_len)  # the prompts the steps trace
    tokens = traced[variant]
    say(f"traced on natural/{variant}")
    found = massive_channel_sets(model, tokens)
    channel, creating, sets = found.channel, found.creating_layer, found.sets
    named = [s for s in sets.values() if s.units]
    positions = args.positions if args.positions is not None else sorted(
        {p for p in (4, 8, t_len // 2) if 1 <= p < t_len - 1})
    sn = {"layer": creating, "channel": channel}
    grid = [float(d) for d in chain.DEFAULT_DOSES]
    c4_doses = len(positions) * (len(structural_origin.MASK_STRENGTHS)
                                 + 3 * len(structural_origin.AMPLIFY_FACTORS)
                                 + len(structural_origin.PLANT_FACTORS))
    first_tokens = 0
    for suite in SUITES:
        for variant in VARIANTS:
            try:
                first_tokens += make_prompts(model, suite, variant, n=nc, seq_len=t_len,
                                             seed=0).tokens.numel()
            except Exception:  # a variant the tokenizer cannot make: the step skips it too
                pass
    has_bq = any(query_bias(model, lay) is not None for lay in range(int(model.cfg.n_layers)))
    twin_build = init_structure.twin_factory(model)
    _, build_s = timed(lambda: twin_build(0))
    # C7 reads token preference at every depth: the last position of each random sequence
    # unembedded after every block, at least one call's work per twin
    last_states = torch.randn(int(model.cfg.n_layers), nc, int(model.cfg.d_model))
    with torch.no_grad():
        depth_unembed_s = min(timed(lambda: unembed(model, last_states))[1] for _ in range(2))

    steps: list[tuple[str, str, bool, Callable[[], Any], int, float, bool]] = [
        # key, name, changed by the stacked path, run, least tokens, least extra seconds,
        # whether it reads the loss (its least tokens then go to the loss)
        ("first", "first-token table", True, lambda: atlas.first_token_table(
            model, nc, t_len, 0, DEFAULT_EPS, bs), first_tokens, 0.0, False),
        ("variance", "variance (C1)", False, lambda: structural_origin.variance_part(
            model, nc, t_len), 2 * nc * t_len, 0.0, False),
        ("sets", f"set validation (C2, {len(named)} sets)", True, lambda: validate_sets(
            model, tokens, named, batch_size=bs), (1 + 2 * len(named)) * n * t_len, 0.0, False),
        ("dose", f"dose-response (C3, {len(grid)} doses)", True, lambda: chain.dose_response(
            model, tokens, chain.neuron_set(model, creating, sets[creating].units,
                                            channels=[channel]), grid, batch_size=bs),
         len(grid) * n * t_len, 0.0, True),
        ("c4", f"structural origin (C4, k={positions}, {c4_doses} doses)", True,
         lambda: structural_origin.move_the_sink(model, tokens, sn, positions, batch_size=bs),
         (1 + c4_doses) * n * t_len, 0.0, False),
    ]
    p0_work = BlockTokens(model)

    def p0() -> Any:
        with p0_work:
            return p0_sink.run(model, n=n, seq_len=t_len, batch_size=bs)

    steps.append(("c5", "P0-sink circuit (C5)", False, p0, 0, 0.0, False))
    if has_bq:
        steps.append(("c6", "query-bias dose (C6)", True, lambda: query_bias_dose.run(
            model, n=n, seq_len=t_len, batch_size=bs), 0, 0.0, True))
    steps.append(("c7", f"C7 init structure ({atlas.TWIN_SEEDS} twins)", False,
                  lambda: atlas.c7_twins(twin_build, {"seed": 0, "n": nc, "seq_len": t_len}),
                  (atlas.TWIN_SEEDS + 1) * nc * t_len,
                  atlas.TWIN_SEEDS * (build_s + depth_unembed_s), False))
    table = []
    for key, name, changed, fn, least_tokens, extra, reads_loss in steps:
        if key in args.skip:
            continue
        modes = [True, False] if changed and args.before else [True]
        for on in modes:
            SPEEDUPS["stacked"] = on
            try:
                out, t = timed(fn)
            finally:
                SPEEDUPS["stacked"] = True
            if key == "c5":  # its blocks as run: every forward of its search is needed
                least_tokens = p0_work.tokens
            if key == "c6":  # its forwards: one per (part, dose) that ran
                least_tokens = sum(len(c["doses"]) for c in out.data["curves"].values()) \
                    * n * t_len
            row = {"step": name + ("" if on else ", one forward per dose"), "time_s": t,
                   "least_tokens": least_tokens, "least_extra_s": extra,
                   "reads_loss": reads_loss, "load": load()}
            table.append(row)
            say(f"{row['step']}: {t:.1f} s ({load()})")
    say(f"plain forward again: {rate.measure():,.0f} tokens/s, the faster kept ({load()})")
    print(f"\n{args.model}: n={n} prompts (interventions), n={nc} (census), T={t_len}; "
          f"least work at {rate.best:,.0f} tokens/s through the blocks, {rate.best_loss:,.0f} "
          f"to the loss (plain forwards of {args.rows} sequences)\n")
    print("| step | time s | least work s | efficiency | load |")
    print("|---|---|---|---|---|")
    for row in table:
        row["least_s"] = rate.seconds(row["least_tokens"], row["reads_loss"]) \
            + row["least_extra_s"]
        row["efficiency"] = row["least_s"] / row["time_s"]
        print(f"| {row['step']} | {row['time_s']:.1f} | {row['least_s']:.1f} | "
              f"{row['efficiency']:.2f} | {row['load']} |")
    if args.out:
        atomic_write_json(args.out, {"model": args.model, "n": n, "n_census": nc,
                                     "seq_len": t_len, "tokens_per_s": rate.best,
                                     "loss_tokens_per_s": rate.best_loss, "build_s": build_s,
                                     "depth_unembed_s": depth_unembed_s, "rows": table})


if __name__ == "__main__":
    main()
