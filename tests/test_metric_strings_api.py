"""The Python API reads the CLI's metric strings exactly as the CLI does (one parser)."""

from __future__ import annotations

import pytest
import torch

from mechsink.errors import BadInputError
from mechsink.patching import MassiveValue, activation_patch


def test_activation_patch_takes_a_metric_string(gpt2_tiny):
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(100, 5000, (2, 6), generator=gen)
    corrupted = torch.randint(100, 5000, (2, 6), generator=gen)
    clean[:, 0] = corrupted[:, 0] = 50256
    by_string = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre",
                                 "massive_value:1:0:5", prepend_bos=False)
    by_object = activation_patch(gpt2_tiny, clean, corrupted, "resid_pre",
                                 MassiveValue(1, 0, 5), prepend_bos=False)
    assert torch.equal(by_string.values, by_object.values)
    with pytest.raises(BadInputError, match="massive_value"):
        activation_patch(gpt2_tiny, clean, corrupted, "resid_pre", "massive_value:1:0",
                         prepend_bos=False)


def test_a_non_finite_patch_value_round_trips_as_nan(tmp_path):
    import json
    import math

    from mechsink.patching import PatchResult

    r = PatchResult(values=torch.tensor([[0.5, float("nan")]], dtype=torch.float64),
                    axes=("layer", "pos"), labels={"layer": [0], "pos": [0, 1]}, site="resid_pre",
                    metric="m", clean_value=1.0, corrupted_value=0.0, tokens=[], meta={})
    path = r.to_json(tmp_path / "r.json")
    text = path.read_text()
    def no_literal(name):
        raise AssertionError(f"non-strict JSON literal {name}")

    assert json.loads(text, parse_constant=no_literal)["values"][0][1] is None
    back = PatchResult.from_json(path)
    assert back.values[0, 0] == 0.5 and math.isnan(float(back.values[0, 1]))
