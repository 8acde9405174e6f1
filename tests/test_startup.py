"""Fast start: `import mechsink` and the command line import no torch, TransformerLens,
transformers or matplotlib at top level; `mechsink.viz` and the model functions come on first
use (issue #30 items 3 and 8)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("torch", "transformer_lens", "transformers", "matplotlib")


def _modules_after(code: str) -> dict[str, bool]:
    probe = (code + "\nimport json, sys\n"
             f"print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_mechsink_is_light() -> None:
    assert _modules_after("import mechsink") == dict.fromkeys(HEAVY, False)


def test_cli_import_and_help_are_light() -> None:
    code = ("import sys\nsys.argv = ['mechsink', '--help']\nfrom mechsink.app.cli import app\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code")
    assert _modules_after(code) == dict.fromkeys(HEAVY, False)


def test_viz_and_model_functions_are_attributes() -> None:
    code = ("import mechsink\nassert callable(mechsink.viz.attention)\n"
            "assert callable(mechsink.load_model) and callable(mechsink.list_models)\n"
            "assert 'viz' in dir(mechsink)\n"
            "try:\n    mechsink.no_such_thing\nexcept AttributeError:\n    pass\n"
            "else:\n    raise SystemExit('no AttributeError')")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_default_eps_is_the_measurement_default() -> None:
    from mechsink.measure.sinks import DEFAULT_EPS
    from mechsink.settings import DEFAULT_EPS as CLI_DEFAULT

    assert CLI_DEFAULT == DEFAULT_EPS


def test_models_command_is_light() -> None:
    """`mechsink models` lists the zoo without torch or transformers: parameter counts come
    from the random families' sizes and the converted folders' safetensors headers."""
    code = ("import sys\nsys.argv = ['mechsink', 'models']\nfrom mechsink.app.cli import app\n"
            "try:\n    app()\nexcept SystemExit as e:\n    assert e.code in (0, None), e.code")
    assert _modules_after(code) == dict.fromkeys(HEAVY, False)


def test_parameter_counts_equal_the_models_own() -> None:
    """The arithmetic counts equal transformers' own (the model built on the meta device)."""
    import torch
    from transformers import AutoModelForCausalLM

    from mechsink.model.zoo.random_init import random_config, random_n_params, random_names

    for name in random_names():
        spec = name.removeprefix("random:")
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(random_config(spec))
        assert random_n_params(spec) == sum(p.numel() for p in model.parameters()), name


def test_safetensors_header_count_equals_the_saved_models(tmp_path) -> None:
    from mechsink.model import load_model, save_organism
    from mechsink.model.kinds import hf_model_of
    from mechsink.model.zoo.listing import safetensors_numel

    model = load_model("random:llama-tiny")
    folder = tmp_path / "org"
    save_organism(model, folder)
    n = sum(safetensors_numel(p) for p in folder.glob("*.safetensors"))
    assert n == sum(p.numel() for p in hf_model_of(model).parameters())
