"""``GraphRun.mask_values`` runs each distinct row once, takes the two ends of every curve
(every edge kept, none kept) from the clean and every-edge-corrupted runs, and injects a
block's q, k and v from one shared product: the values must be those of each row run on its
own through the plain injection."""

from __future__ import annotations

import torch

from mechsink.discover import GraphRun
from mechsink.inputs.prompts import make_prompts
from mechsink.patching import MassiveValue


def test_rows_equal_their_own_runs(llama_tiny):
    tokens = make_prompts(llama_tiny, "natural", "bos", n=2, seq_len=6).tokens
    run = GraphRun(llama_tiny, tokens, MassiveValue(1, 0, 3), ablation="zero")
    n = run.graph.n_edges
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.rand(n, generator=gen) < 0.5 for _ in range(2))
    rows = torch.stack([torch.ones(n, dtype=torch.bool), a, torch.zeros(n, dtype=torch.bool),
                        a, b, torch.ones(n, dtype=torch.bool)])
    got = run.mask_values(rows, batch=2)
    # each row on its own, every edge outside it corrupted, through the injection that
    # gradient runs use (one einsum per slot: not the buffer the block's q, k and v share)
    alone = [float(run.run_coeffs(run.graph.dense((~r).to(run.delta.dtype)).unsqueeze(0),
                                  with_grad=True)[0][0]) for r in rows]
    assert torch.allclose(got, torch.tensor(alone, dtype=torch.float64), rtol=1e-5, atol=1e-6)
    assert got[0] == got[5] == run.clean_value and got[2] == run.empty_value
    assert got[1] == got[3] and got[1] != got[4]
