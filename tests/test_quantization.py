"""Simulated activation quantization: against a hand quantizer (explicit loops over numbers),
and what keeping a planted massive channel in full precision does."""

from __future__ import annotations

import math

import pytest
import torch

from mechsink.inputs.prompts import make_prompts
from mechsink.measure.quantization import (
    HOOKS,
    QuantizationErrors,
    fake_quantize,
    quantization_errors,
)


def _hand(rows: list[list[float]], bits: int, per_channel: bool, keep: set[int],
          outliers: set[int]) -> float:
    """Relative error over the channels not in ``outliers`` of one [pos][channel] matrix,
    quantized number by number (channels in ``keep`` left alone and setting no scale)."""
    qmax = 2 ** (bits - 1) - 1
    n_pos, n_ch = len(rows), len(rows[0])

    def peak(cols: list[int]) -> float:
        return max(abs(rows[p][c]) for p in range(n_pos) for c in cols)

    free = [c for c in range(n_ch) if c not in keep]
    err = total = 0.0
    for c in range(n_ch):
        m = peak([c]) if per_channel else peak(free)
        scale = m / qmax if m > 0 else 1.0
        for p in range(n_pos):
            x = rows[p][c]
            q = x if c in keep else max(-qmax, min(qmax, _round_half_even(x / scale))) * scale
            if c not in outliers:
                err += (x - q) ** 2
                total += x * x
    return math.sqrt(err) / math.sqrt(total)


def _outliers(rows: list[list[float]], site: str) -> set[int]:
    """Outlier channels by hand: |x| > 50 anywhere (down-projection input), or |x| > 100 and
    >= 1000 x the median |x| of the matrix (residual)."""
    flat = sorted(abs(v) for r in rows for v in r)
    n = len(flat)
    median = flat[n // 2] if n % 2 else (flat[n // 2 - 1] + flat[n // 2]) / 2
    return {c for r in rows for c, v in enumerate(r)
            if (abs(v) > 50 if site == "mlp.hook_post" else abs(v) > 100 and
                abs(v) >= 1000 * median)}


def _round_half_even(v: float) -> float:
    return float(round(v))  # Python's round is half-to-even, as torch.round


def test_errors_match_a_hand_quantizer_on_a_tiny_model(llama_tiny):
    tokens = make_prompts(llama_tiny, "natural", "bos", n=2, seq_len=6, seed=1).tokens
    names = [f"blocks.{layer}.{s}" for s in HOOKS for layer in range(llama_tiny.cfg.n_layers)]
    with torch.no_grad():
        _, cache = llama_tiny.run_with_cache(tokens, names_filter=names, return_type=None)
    got = quantization_errors(cache)
    for site in HOOKS:
        for layer in range(llama_tiny.cfg.n_layers):
            acts = cache[f"blocks.{layer}.{site}"].double()
            for b in range(tokens.shape[0]):
                rows = acts[b].tolist()
                for bits in (8, 4):
                    for gran in ("per_tensor", "per_channel"):
                        out = _outliers(rows, site)
                        want = _hand(rows, bits, gran == "per_channel", set(), out)
                        have = got.errors[(site, bits, gran, False)][b, layer].item()
                        assert have == pytest.approx(want, rel=1e-4, abs=1e-7), \
                            (site, layer, b, bits, gran)


def test_keeping_a_planted_massive_channel_in_full_precision():
    """Channel 2 holds 3000 at position 0 (massive against a median of ~1): per tensor it sets
    the scale and int4 flattens every other channel to 0; kept in full precision, the error
    falls to what int4 does to ordinary values. The hand quantizer agrees in both cases."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 8, 6, generator=gen)
    x[0, 0, 2] = 3000.0
    cache = {"blocks.0.hook_resid_post": x}
    got = quantization_errors(cache, sites=("hook_resid_post",))
    assert got.kept["hook_resid_post"].tolist() == [[1.0]]
    rows = x[0].double().tolist()
    for bits in (8, 4):
        for gran in ("per_tensor", "per_channel"):
            for kept in (False, True):
                want = _hand(rows, bits, gran == "per_channel", {2} if kept else set(), {2})
                have = got.errors[("hook_resid_post", bits, gran, kept)][0, 0].item()
                assert have == pytest.approx(want, rel=1e-4, abs=1e-7)
    # without keeping, the int4 per-tensor scale is 3000/7: every ordinary value rounds to 0
    flat = fake_quantize(x, 4, "per_tensor")
    assert (flat[0, :, [0, 1, 3, 4, 5]] == 0).all()
    err_all = got.errors[("hook_resid_post", 4, "per_tensor", False)][0, 0].item()
    err_kept = got.errors[("hook_resid_post", 4, "per_tensor", True)][0, 0].item()
    assert err_all == pytest.approx(1.0) and err_kept < 0.2  # all rounded to 0, or not
    data = got.to_dict()["quantization"]
    assert data["residual"]["int4"]["per_tensor"]["outliers_kept"] == [pytest.approx(
        err_kept, abs=1e-4)]
    merged = QuantizationErrors.merge([got, got])
    assert merged.errors[("hook_resid_post", 8, "per_channel", True)].shape == (2, 1)
