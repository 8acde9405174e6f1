"""Weight-only round-to-nearest quantization and the super weight: against a hand quantizer
(plain Python loops over rows and groups) and the loss of plain transformers with its weights
edited by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from mechsink.errors import BadInputError
from mechsink.interventions.weight_quantization import (
    SuperWeight,
    outliers_zeroed,
    quantize_rtn,
    quantized_weights,
    super_weights_of,
    weight_quantization_loss,
    zeroed_weights,
)

GROUP = 32  # llama-tiny's MLP is 176 wide: five full groups and one of 16
SETS = {0: list(range(0, 176, 2)), 1: [3]}  # W_out[n, CHANNEL] of these play the super weights
# (half of a row of layer 0: enough that zeroing them moves a random model's loss)
CHANNEL = 7


def _hand_rtn(w: torch.Tensor, bits: int, group: int | None, symmetric: bool,
              keep: torch.Tensor | None = None) -> torch.Tensor:
    """Round to nearest, one row and one group at a time, in Python floats."""
    out = w.detach().double().clone()
    rows, cols = w.shape
    size = cols if group is None else group
    for r in range(rows):
        for start in range(0, cols, size):
            idx = [c for c in range(start, min(start + size, cols))
                   if keep is None or not bool(keep[r, c])]
            vals = [float(w[r, c]) for c in idx]
            if not vals:
                continue
            if symmetric:
                qmax = 2 ** (bits - 1) - 1
                scale = max(abs(v) for v in vals) / qmax
                if scale == 0:
                    continue
                for c, v in zip(idx, vals, strict=True):
                    out[r, c] = max(-qmax, min(qmax, round(v / scale))) * scale
            else:
                levels = 2 ** bits - 1
                scale = (max(vals) - min(vals)) / levels
                if scale == 0:
                    continue
                zero = round(-min(vals) / scale)
                for c, v in zip(idx, vals, strict=True):
                    out[r, c] = (max(0, min(levels, round(v / scale) + zero)) - zero) * scale
    return out


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group", [4, None])
def test_quantize_rtn_matches_a_hand_quantizer(symmetric, group):
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(6, 10, generator=gen)  # 10 = two groups of 4 and one of 2
    w[2, 3] = 40.0  # an outlier that would set its group's scale
    keep = torch.zeros(6, 10, dtype=torch.bool)
    keep[2, 3] = True
    for k in (None, keep):
        got = quantize_rtn(w, 4, group, symmetric=symmetric, keep=k)
        want = _hand_rtn(w, 4, group, symmetric, k)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    kept = quantize_rtn(w, 4, group, symmetric=symmetric, keep=keep)
    assert kept[2, 3] == 40.0
    # the kept outlier no longer sets the scale: its row's other entries round more finely
    plain = quantize_rtn(w, 4, group, symmetric=symmetric)
    row = [c for c in range(10) if c != 3]
    assert (kept[2, row] - w[2, row]).abs().sum() < (plain[2, row] - w[2, row]).abs().sum()


def _hf_linears(hf: nn.Module) -> dict[str, nn.Linear]:
    head = hf.get_output_embeddings()
    return {n: m for n, m in hf.named_modules() if isinstance(m, nn.Linear) and m is not head}


def _hf_loss(hf: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Per-sequence mean next-token loss, by hand from transformers' logits."""
    with torch.no_grad():
        logits = hf(tokens).logits.double()
    logp = torch.log_softmax(logits[:, :-1], -1)
    return -logp.gather(-1, tokens[:, 1:, None])[..., 0].mean(1)


def test_losses_match_plain_transformers_with_hand_edited_weights(llama_tiny):
    from mechsink.model.zoo import random_hf_model

    tokens = torch.randint(0, 1000, (3, 12), generator=torch.Generator().manual_seed(1))
    sw = super_weights_of(llama_tiny, SETS, CHANNEL)
    before = {n: m.weight.detach().clone() for n, m in _weight_modules(llama_tiny).items()}
    got = weight_quantization_loss(llama_tiny, tokens, group_size=GROUP, super_weights=sw,
                                   n_outliers=50, batch_size=2)
    for n, m in _weight_modules(llama_tiny).items():  # every weight back as it was
        assert torch.equal(m.weight, before[n]), n

    hf, _ = random_hf_model("llama-tiny", seed=0)
    lin = _hf_linears(hf)
    down = {lay: lin[f"model.layers.{lay}.mlp.down_proj"] for lay in SETS}
    assert [s.value for s in sw] == [float(down[lay].weight.detach()[CHANNEL, n])
                                     for lay, ns in SETS.items() for n in ns]
    original = {n: m.weight.detach().clone() for n, m in lin.items()}

    def reset():
        with torch.no_grad():
            for n, m in lin.items():
                m.weight.copy_(original[n])

    def keep_mask(name):
        mask = torch.zeros_like(original[name], dtype=torch.bool)
        for lay, ns in SETS.items():
            if name == f"model.layers.{lay}.mlp.down_proj":
                for n in ns:
                    mask[CHANNEL, n] = True
        return mask

    want = {"fp": _hf_loss(hf, tokens)}
    for tag, size in (("group", GROUP), ("channel", None)):
        for kept in (False, True):
            with torch.no_grad():
                for n, m in lin.items():
                    m.weight.copy_(_hand_rtn(original[n], 4, size, False,
                                             keep_mask(n) if kept else None).float())
            want[f"int4_{tag}{'_super_kept' if kept else ''}"] = _hf_loss(hf, tokens)
            reset()
    with torch.no_grad():
        for lay, ns in SETS.items():
            for n in ns:
                down[lay].weight[CHANNEL, n] = 0.0
    want["super_zeroed"] = _hf_loss(hf, tokens)
    reset()
    # no contributions given: the top super weight is the largest in magnitude
    lay, n = max(((lay, n) for lay, ns in SETS.items() for n in ns),
                 key=lambda ln: abs(float(original[f"model.layers.{ln[0]}.mlp.down_proj"]
                                          [CHANNEL, ln[1]])))
    with torch.no_grad():
        down[lay].weight[CHANNEL, n] = 0.0
    want["top_super_zeroed"] = _hf_loss(hf, tokens)
    reset()
    # the 50 largest |w| over every linear weight but the super weights, zeroed
    entries = sorted(((abs(float(v)), name, i) for name, w in original.items()
                      for i, v in enumerate(w.flatten().tolist())
                      if not keep_mask(name).flatten()[i]), reverse=True)[:50]
    with torch.no_grad():
        for _, name, i in entries:
            lin[name].weight.view(-1)[i] = 0.0
    want["super_kept_alone"] = _hf_loss(hf, tokens)

    assert set(got.losses) == set(want)
    for name, loss in want.items():
        torch.testing.assert_close(got.losses[name], loss, rtol=1e-4, atol=1e-5, msg=name)
    assert got.n_outliers == 50 and got.n_linear == len(lin)
    # the settings differ from full precision (the test is not vacuous)
    for name in want:
        if name not in ("fp", "top_super_zeroed"):  # one weight of a random model: tiny
            assert (got.losses[name] - got.losses["fp"]).abs().max() > 1e-4, name
    assert not torch.equal(got.losses["top_super_zeroed"], got.losses["fp"])
    out = got.to_dict()
    assert out["settings"]["fp"]["perplexity"] == pytest.approx(
        math.exp(float(want["fp"].mean())), rel=1e-4)
    assert len(out["super_weights"]) == 89
    assert (out["top_super_weight"]["layer"], out["top_super_weight"]["neuron"]) == (lay, n)


def _weight_modules(model):
    from mechsink.interventions.weight_quantization import linear_weights

    return linear_weights(model)


def test_edits_are_undone_after_an_exception(llama_tiny):
    mods = _weight_modules(llama_tiny)
    before = {n: m.weight.detach().clone() for n, m in mods.items()}
    sw = super_weights_of(llama_tiny, SETS, CHANNEL)
    for scope in (lambda: quantized_weights(llama_tiny, 4, GROUP, keep=sw),
                  lambda: zeroed_weights(llama_tiny, sw),
                  lambda: outliers_zeroed(llama_tiny, 20, spare=sw)):
        with pytest.raises(RuntimeError, match="boom"), scope():
            assert any(not torch.equal(m.weight, before[n]) for n, m in mods.items())
            raise RuntimeError("boom")
        for n, m in mods.items():
            assert torch.equal(m.weight, before[n]), n


def test_gpt2_conv1d_weights_are_quantized_along_their_input(gpt2_tiny):
    mods = _weight_modules(gpt2_tiny)
    conv = mods["transformer.h.0.mlp.c_proj"]  # Conv1D: weight [in, out]
    w = conv.weight.detach().clone()
    with quantized_weights(gpt2_tiny, 4, 16):
        torch.testing.assert_close(conv.weight.detach().double(),
                                   _hand_rtn(w.T, 4, 16, False).T, rtol=1e-5, atol=1e-6)
    assert torch.equal(conv.weight, w)
    sw = SuperWeight(0, 3, 5, "transformer.h.0.mlp.c_proj", 0.0)
    with zeroed_weights(gpt2_tiny, [sw]):
        assert conv.weight[3, 5] == 0.0


def test_bad_input_is_refused_before_any_work(llama_tiny):
    tokens = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(BadInputError, match="bits"):
        weight_quantization_loss(llama_tiny, tokens, bits=1, super_weights=[])
    with pytest.raises(BadInputError, match="group_size"):
        weight_quantization_loss(llama_tiny, tokens, group_size=0, super_weights=[])
    with pytest.raises(BadInputError, match="n_outliers"):
        weight_quantization_loss(llama_tiny, tokens, n_outliers=-1, super_weights=[])
    with pytest.raises(BadInputError, match="pos >= 2"):
        weight_quantization_loss(llama_tiny, tokens[:, :1], super_weights=[])


@pytest.mark.slow
def test_smollm2_super_weights_matter_more_than_as_many_others(smollm2):
    """Yu et al.'s finding on the real model: zeroing the few super weights costs far more loss
    than zeroing as many other entries of the same down projections."""
    from mechsink.inputs.prompts import make_prompts
    from mechsink.interventions.weight_quantization import find_super_weights, sequence_losses

    tokens = make_prompts(smollm2, "natural", "bos", n=4, seq_len=32).tokens
    sw = find_super_weights(smollm2, tokens)
    assert sw and all(s.module.endswith("mlp.down_proj") for s in sw)
    fp = sequence_losses(smollm2, tokens).mean()
    with zeroed_weights(smollm2, sw):
        zeroed = sequence_losses(smollm2, tokens).mean()
    width = int(smollm2.cfg.d_mlp)
    others = [SuperWeight(s.layer, (s.neuron + 1) % width, s.channel, s.module, 0.0) for s in sw]
    with zeroed_weights(smollm2, others):
        other = sequence_losses(smollm2, tokens).mean()
    assert zeroed - fp > 1.0 and abs(other - fp) < 0.1
    assert sequence_losses(smollm2, tokens).mean() == fp  # every weight restored


def test_top_super_weight_is_the_largest_contribution_else_the_largest_value():
    from mechsink.interventions.weight_quantization import top_super_weight

    a = SuperWeight(1, 2, 3, "m", 5.0, 0.5)
    b = SuperWeight(1, 4, 3, "m", -0.1, -9.0)
    assert top_super_weight([a, b]) is b
    assert top_super_weight([a, SuperWeight(1, 4, 3, "m", -0.1)]) is a
    with pytest.raises(BadInputError, match="no super weights"):
        top_super_weight([])


def test_weight_quant_command_writes_its_table_and_refuses_bad_options_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from mechsink.app.cli import app

    out = tmp_path / "wq"
    done = CliRunner().invoke(app, ["weight-quant", "random:llama-tiny", "--n", "2",
                                    "--seq-len", "8", "--out", str(out)])
    assert done.exit_code == 0, done.output
    data = json.loads((out / "weight_quantization.json").read_text())
    assert {"fp", "int4_group", "super_zeroed"} <= set(data["settings"])
    assert (out / "weight_quantization.png").stat().st_size > 0

    def no_load(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("mechsink.model.zoo.load_model", no_load)
    bad = CliRunner().invoke(app, ["weight-quant", "random:llama-tiny", "--n", "0",
                                   "--out", str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "--n must be positive" in bad.output
    assert not (tmp_path / "bad" / "weight_quantization.json").exists()
