"""Half precision on CPU (what a GPU user runs) against float32, on tiny models of the families
the zoo and most users hold, with the tolerances the README states; and a massive activation
beyond float16's range is stated, not a silent inf."""

from __future__ import annotations

import pytest
import torch

from tests.architectures import builder

#: the largest |logit difference| from float32, relative to the largest |logit| (README)
TOLERANCE = {"bfloat16": 0.05, "float16": 0.01}
FAMILIES = ["LlamaForCausalLM", "GPT2LMHeadModel", "Gemma2ForCausalLM", "Qwen2ForCausalLM",
            "GPTNeoXForCausalLM", "PhiForCausalLM"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("precision")
    return {a: builder.save(a, root).folder for a in FAMILIES}


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("arch", FAMILIES)
def test_half_precision_logits_within_the_stated_tolerance(folders, arch, dtype):
    import mechsink

    tokens = torch.tensor(builder.PROBE)
    with torch.no_grad():
        ref = mechsink.load_model(f"hf:{folders[arch]}", device="cpu")(tokens).double()
        got = mechsink.load_model(f"hf:{folders[arch]}", device="cpu", dtype=dtype)(tokens)
    assert got.dtype == getattr(torch, dtype)
    diff = ((got.double() - ref).abs().max() / ref.abs().max()).item()
    assert 0 < diff <= TOLERANCE[dtype]


def test_a_massive_activation_beyond_float16_is_stated_by_the_census(folders):
    """A residual channel pushed past 65504 in float16 becomes inf: the census says where, in
    its not_applicable object, instead of writing inf (or None) as a massive value."""
    import mechsink
    from mechsink.inputs.prompts import PromptSet
    from mechsink.measure.census import census

    model = mechsink.load_model(f"hf:{folders['LlamaForCausalLM']}", device="cpu",
                                dtype="float16")
    with torch.no_grad():  # one huge output weight: channel 3 of layer 0's MLP write
        model.original_model.model.layers[0].mlp.down_proj.weight[3].fill_(60000.0)
    got = census(model, prompts=[PromptSet("custom", "given", torch.tensor(builder.PROBE))],
                 batch_size=2, progress=lambda *a: None).to_dict()["runs"][0]
    why = got["not_applicable"]["massive"]
    assert "channel 3" in why and "layer 0" in why and "65504" in why
