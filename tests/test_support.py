"""The model package's dependencies run one way, and ``check_supported`` refuses a model an
entry point cannot run exactly, in one line, before any work (issue #25 item 6)."""

from __future__ import annotations

import ast
from pathlib import Path

MODEL = Path(__file__).resolve().parents[1] / "mechsink" / "model"


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """The mechsink modules ``path`` imports at module level and inside functions."""
    top: set[str] = set()
    inner: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mechsink"):
            (top if node in tree.body else inner).add(node.module or "")
    return top, inner


def test_probes_forward_and_kv_import_each_other_one_way_at_module_level():
    names = ("probes", "forward", "kv", "shortcuts")
    found = {n: _imports(MODEL / f"{n}.py") for n in names}
    for name, (_, inner) in found.items():
        assert not {f"mechsink.model.{n}" for n in names} & inner, name
    assert "mechsink.model.forward" not in found["probes"][0]
    assert "mechsink.model.kv" not in found["probes"][0]
    assert "mechsink.model.probes" not in found["shortcuts"][0]
    assert "mechsink.model.probes" in found["forward"][0]
    assert "mechsink.model.probes" in found["kv"][0]
