"""The ablation vocabulary: each kind's replacement checked against a hand computation."""

from __future__ import annotations

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.interventions.ablation import Ablation, as_ablation

# batch 2, pos 3, d 1: small enough to write every mean out by hand
ACT = torch.tensor([[[1.0], [2.0], [6.0]], [[3.0], [4.0], [8.0]]])


def test_zero():
    assert Ablation("zero").values(ACT).tolist() == [[[0.0]] * 3] * 2


def test_batch_mean_is_the_mean_over_sequences_at_each_position():
    got = Ablation("batch_mean").values(ACT)
    assert got.tolist() == [[[2.0], [3.0], [7.0]]] * 2  # (1+3)/2, (2+4)/2, (6+8)/2
    ref = torch.tensor([[[0.0], [0.0], [0.0]], [[10.0], [20.0], [30.0]], [[2.0], [4.0], [0.0]]])
    got = Ablation("batch_mean").values(ACT, reference=ref)
    assert got.tolist() == [[[4.0], [8.0], [10.0]]] * 2


def test_position_mean_is_the_mean_over_the_other_positions_of_the_same_sequence():
    first = torch.tensor([True, False, False])
    got = Ablation("position_mean").values(ACT, first)
    assert got[0, 0].item() == 4.0 and got[1, 0].item() == 6.0  # (2+6)/2, (4+8)/2
    middle = torch.tensor([False, True, False])
    got = Ablation("position_mean").values(ACT, middle)
    assert got[0, 1].item() == 3.5 and got[1, 1].item() == 5.5  # (1+6)/2, (3+8)/2
    with pytest.raises(BadInputError, match="at least one position"):
        Ablation("position_mean").values(ACT, torch.ones(3, dtype=torch.bool))


def test_resample_takes_whole_sequences_from_the_reference():
    ref = torch.arange(12.0).reshape(4, 3, 1)
    got = Ablation("resample", seed=3).values(ACT, reference=ref)
    rows = torch.randint(4, (2,), generator=torch.Generator().manual_seed(3))
    assert torch.equal(got, ref[rows])
    assert torch.equal(got, Ablation("resample", seed=3).values(ACT, reference=ref))


def test_names_and_bad_input():
    assert as_ablation("batch_mean") == Ablation("batch_mean")
    assert as_ablation(None) is None
    # "mean" meant batch_mean in patching and position_mean in ablate: say which one
    with pytest.raises(BadInputError, match="batch_mean.*position_mean"):
        as_ablation("mean")
    with pytest.raises(BadInputError, match="unknown ablation 'median'"):
        as_ablation("median")
    with pytest.raises(BadInputError, match="do not match"):
        Ablation("batch_mean").values(ACT, reference=torch.zeros(2, 4, 1))
