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
