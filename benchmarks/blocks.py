"""One block call through the bridge against transformers' own decoder layer on the same input.

Not a timed test. A forward through the bridge records the arguments its block ``--layer``
receives (hidden states, position embeddings, mask, ...); the same arguments then go to

- the bridge's block (``model.blocks[L]``: the transformers layer whose attention, MLP and
  norms are TransformerLens's wrappers, every hook point in the path);
- the bridge's block inside :func:`mechsink.model.patches.fast_blocks.fast_blocks` (a block
  whose hooks are all empty runs as the plain transformers layer);
- transformers' own decoder layer with the same weights (the model loaded from the zoo's
  converted folder by transformers alone),

at 1 x 1 and 8 x 32 tokens (``--shapes``), best of ``--repeat`` calls of ``--calls`` each, and
prints the seconds per call, the ratio to transformers and the largest difference of the
outputs. Say whether the machine was loaded (the load average is printed): the ratio is what
carries.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/blocks.py [--model smollm2-135m] \
        [--layer 3] [--shapes 1x1,8x32] [--calls 50] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch

from mechsink import load_model
from mechsink.model import hf_model_of
from mechsink.model.patches.fast_blocks import fast_blocks
from mechsink.model.zoo.cache import converted_dir


def per_call(fns: list[tuple[Callable[[], Any], Callable[[], Any]]], calls: int,
             repeat: int) -> list[float]:
    """Least seconds per call of each ``(fn, context)`` over ``repeat`` rounds of ``calls``
    calls inside ``context()``, the functions taking turns within each round (a shared
    machine's load hits them alike)."""
    best = [float("inf")] * len(fns)
    with torch.no_grad():
        for _ in range(repeat):
            for i, (fn, context) in enumerate(fns):
                with context():
                    t = time.perf_counter()
                    for _ in range(calls):
                        fn()
                    best[i] = min(best[i], (time.perf_counter() - t) / calls)
    return best


def block_arguments(model: Any, layer: int, tokens: torch.Tensor) -> tuple[tuple, dict]:
    """The positional and keyword arguments block ``layer`` receives in a plain forward
    (without the forward's key/value cache, which would grow with every timed call)."""
    got: dict[str, Any] = {}

    def keep(module: Any, args: tuple, kwargs: dict) -> None:
        got.setdefault("call", (args, dict(kwargs)))

    handle = model.blocks[layer].register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        handle.remove()
    args, kwargs = got["call"]
    for key in ("past_key_values", "past_key_value", "cache"):  # no cache: each call the same work
        kwargs.pop(key, None)
    if "use_cache" in kwargs:
        kwargs["use_cache"] = False
    return args, kwargs


def first(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--layer", type=int, default=3)
    ap.add_argument("--shapes", default="1x1,8x32")
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    import transformers

    model = load_model(args.model, device="cpu")
    impl = hf_model_of(model).config._attn_implementation
    plain = transformers.AutoModelForCausalLM.from_pretrained(
        str(converted_dir(args.model)), attn_implementation=impl, dtype=torch.float32).eval()
    layer = plain.model.layers[args.layer]
    print(f"{args.model}, block {args.layer}, attention {impl}, torch threads "
          f"{torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    print("| tokens | transformers s/call | bridge s/call | ratio | bridge, fast_blocks s/call "
          "| ratio | max abs diff (bridge, fast) |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        b, s = (int(x) for x in shape.split("x"))
        tokens = torch.randint(5, int(model.cfg.d_vocab), (b, s),
                               generator=torch.Generator().manual_seed(0))
        a, kw = block_arguments(model, args.layer, tokens)
        with torch.no_grad():
            ref = first(layer(*a, **kw))
            got = first(model.blocks[args.layer](*a, **kw))
            with fast_blocks(model):
                fast = first(model.blocks[args.layer](*a, **kw))
        hf_call = partial(layer, *a, **kw)
        block_call = partial(model.blocks[args.layer], *a, **kw)
        t_hf, t_br, t_fast = per_call([(hf_call, nullcontext), (block_call, nullcontext),
                                       (block_call, partial(fast_blocks, model))],
                                      args.calls, args.repeat)
        print(f"| {b} x {s} | {t_hf * 1e3:.3f} ms | {t_br * 1e3:.3f} ms | {t_br / t_hf:.2f} | "
              f"{t_fast * 1e3:.3f} ms | {t_fast / t_hf:.2f} | "
              f"{float((got - ref).abs().max()):.1e}, {float((fast - ref).abs().max()):.1e} |")


if __name__ == "__main__":
    main()
