"""The API reference (docs/api) lists every public function and class, and no docstring points
a reader at a file that is not in the repository."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: packages whose ``__all__`` is public, and modules whose every public name is
PACKAGES = ["mechsink", "mechsink.patching", "mechsink.viz", "mechsink.discover"]
MODULES = [
    "mechsink.interventions.readout", "mechsink.interventions.ablation",
    "mechsink.interventions.edits", "mechsink.measure.census", "mechsink.inputs.prompts",
    "mechsink.progress", "mechsink.interventions.chain",
    "mechsink.errors", "mechsink.measure.sinks", "mechsink.measure.massive",
    "mechsink.measure.super_neurons", "mechsink.measure.norms", "mechsink.measure.variance",
    "mechsink.measure.keys", "mechsink.viz.patching", "mechsink.viz.attention",
    "mechsink.viz.figures", "mechsink.experiments.result", "mechsink.patching.checks",
]


def _documented() -> tuple[set[str], set[str]]:
    """(targets rendered whole, targets rendered) from the ``::: target`` lines of docs/api."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "docs" / "api").glob("*.md"))
    whole, named = set(), set()
    for target, options in re.findall(r"^::: ([\w.]+)[ \t]*\n((?:[ \t]+.*\n?)*)", text + "\n",
                                      re.M):
        named.add(target)
        members = re.search(r"members:\s*\[([^\]]*)\]", options, re.S)
        if members:
            named |= {f"{target}.{m.strip()}" for m in members.group(1).split(",") if m.strip()}
        else:
            whole.add(target)
    return whole, named


def _public(obj: object) -> bool:
    return inspect.isfunction(obj) or inspect.isclass(obj)


def test_every_public_function_is_in_the_api_reference() -> None:
    whole, named = _documented()

    def covered(where: str, attr: str, obj: object) -> bool:
        homes = {where, getattr(obj, "__module__", where)}
        return any(f"{h}.{attr}" in named or h in whole for h in homes)

    missing = []
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        for attr in getattr(pkg, "__all__", []):
            obj = getattr(pkg, attr)
            if _public(obj) and not covered(name, attr, obj):
                missing.append(f"{name}.{attr}")
    for name in MODULES:
        mod = importlib.import_module(name)
        for attr, obj in vars(mod).items():
            if attr.startswith("_") or not _public(obj) or obj.__module__ != name:
                continue
            if not covered(name, attr, obj):
                missing.append(f"{name}.{attr}")
    assert missing == [], f"add these to a page under docs/api: {missing}"
    for must in ("mechsink.interventions.readout", "mechsink.model.adapter.wrap_hf"):
        assert must in named  # what the first notebook user could not find


# a placeholder folder (out_dir/census.json, OUT/run.json) is not a file of the repository
_PLACEHOLDERS = re.compile(r"^(out|out_dir|OUT|DIR|FOLDER|folder|path)/")
_CITED = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|json|ya?ml|toml|ipynb|txt|csv))"
                    r"\b|(?<![\w./-])([A-Z][A-Z_]+\.md)\b")


def test_no_docstring_cites_a_file_outside_the_repository() -> None:
    bad = []
    for path in sorted((ROOT / "mechsink").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                                     ast.ClassDef)):
                continue
            for m in _CITED.finditer(ast.get_docstring(node) or ""):
                cited = m.group(1) or m.group(2)
                if not _PLACEHOLDERS.match(cited) and not (ROOT / cited).exists():
                    bad.append(f"{path.relative_to(ROOT)}:{getattr(node, 'name', '')}: {cited}")
    assert bad == []
