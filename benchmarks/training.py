"""Tokens per second of mechsink's training step against a plain PyTorch loop.

Same model (built from the recipe, same seed), same batches, same optimizer settings, in one
process, alternating rounds so that machine load hits both alike. The two runs must end with
identical losses (they compute the same thing); the ratio is mechsink / plain.

    python benchmarks/training.py [--recipe text-llama-mini] [--steps 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from mechsink.model.zoo import seeded_model
from mechsink.training.loop import get_recipe, lr_at, train_step


def plain_loop(model, optimizer, batches, lrs) -> list[float]:
    """The textbook loop, written out: what mechsink's step must not be slower than."""
    losses = []
    for tokens, lr in zip(batches, lrs, strict=True):
        for group in optimizer.param_groups:
            group["lr"] = lr
        logits = model(tokens).logits
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                               tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


def mechsink_loop(model, optimizer, batches, lrs) -> list[float]:
    return [train_step(model, optimizer, t, lr) for t, lr in zip(batches, lrs, strict=True)]


def fresh(recipe):
    model = seeded_model(recipe.config(), 0, attn_implementation="sdpa").train()
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95),
                            weight_decay=recipe.weight_decay)
    return model, opt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="text-llama-mini")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    recipe = get_recipe(args.recipe)
    task = recipe.task()
    batches = [task.batch(0, s, recipe.batch_size, recipe.seq_len) for s in range(args.steps)]
    lrs = [lr_at(recipe, s, args.steps) for s in range(args.steps)]
    tokens = args.steps * recipe.batch_size * recipe.seq_len
    times: dict[str, list[float]] = {"plain": [], "mechsink": []}
    losses: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, loop in (("plain", plain_loop), ("mechsink", mechsink_loop)):
            model, opt = fresh(recipe)
            start = time.perf_counter()
            losses[name] = loop(model, opt, batches, lrs)
            times[name].append(time.perf_counter() - start)
    assert losses["plain"] == losses["mechsink"], "the two loops disagree"
    plain, ours = (statistics.median(times[k]) for k in ("plain", "mechsink"))
    print(f"recipe {recipe.name}: {args.steps} steps x {recipe.batch_size} x {recipe.seq_len} "
          f"tokens, {args.rounds} rounds, torch threads {torch.get_num_threads()}")
    print("| loop | median s | tokens/s |")
    print("|------|----------|----------|")
    print(f"| plain PyTorch | {plain:.2f} | {tokens / plain:,.0f} |")
    print(f"| mechsink | {ours:.2f} | {tokens / ours:,.0f} |")
    print(f"mechsink / plain throughput: {plain / ours:.3f} (losses identical: yes)")


if __name__ == "__main__":
    main()
