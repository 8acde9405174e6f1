"""The package's rooms import only downwards, and only ``mechsink/model/`` reads TransformerLens's
and transformers' private attributes: both read from the source (``ast``), no import, no model.

The floors are the room table of the README's Architecture section, top to bottom. Every
``import`` / ``from ... import`` of a mechsink module counts, at module level or inside a
function (a deferred import is still a dependency), and so does ``importlib.import_module`` of
a literal ``"mechsink.<room>..."`` name. ``make lint`` runs this file too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mechsink"

#: the rooms, top floor first; a room imports only rooms on floors below its own (rooms that
#: share a floor do not import each other). ``training/`` sits above ``settings.py``, whose
#: checks it uses, and ``settings.py`` above the rooms whose validators it forwards to;
#: ``names.py`` above ``model/``, whose hook names and head counts it parses with.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("app",),
    ("jobs",),
    ("experiments",),
    ("viz",),
    ("discover",),
    ("training",),
    ("settings",),
    ("patching",),
    ("interventions",),
    ("measure",),
    ("inputs",),
    ("names",),
    ("model",),
    ("io", "progress"),
    ("errors", "lazy"),
)

#: imports that run back up, known and to be removed: (importing module, imported room) -> why.
#: The test fails when one of them no longer exists, so the list only shrinks.
KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}

#: what any room may import from the package itself (``mechsink/__init__.py``, the lazy door
#: above every room)
ROOT_NAMES = {"__version__"}


def _floor_of() -> dict[str, int]:
    return {room: i for i, rooms in enumerate(FLOORS) for room in rooms}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str | None:
    """The room of a mechsink module (``mechsink.patching.engine`` -> ``patching``); None for
    the package itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported mechsink module) for every import in ``path``; ``from A import b``
    gives ``A.b`` where that is a module, else ``A``."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                yield node.lineno, full if _is_module(full) else source
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", None)) == "import_module" and node.args):
            arg = node.args[0]
            if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(
                    arg.values[0], ast.Constant):
                arg = arg.values[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                yield node.lineno, arg.value.rstrip(".")


def _arrows() -> Iterator[tuple[str, int, str, str | None, str | None]]:
    """(file, line, importing module, its room, imported room) for every import of one room
    by another; the package's own ``__init__`` (the door above every room) is left out."""
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        room = _room(module)
        if room is None:
            continue
        for line, target in _imports(path):
            if target != "mechsink" and not target.startswith("mechsink."):
                continue
            yield str(path.relative_to(ROOT)), line, module, room, _room(target)


def test_every_room_is_on_a_floor() -> None:
    rooms = {p.stem for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    rooms |= {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    placed = _floor_of()
    assert not rooms - set(placed), (
        f"rooms on no floor: {sorted(rooms - set(placed))}: put each in FLOORS (tests/"
        "test_layers.py) where it belongs, and in the README's room table")
    assert not set(placed) - rooms, f"FLOORS names rooms that do not exist: {set(placed) - rooms}"


def test_rooms_import_only_downwards() -> None:
    floor = _floor_of()
    wrong, used = [], set()
    for where, line, module, room, target in _arrows():
        if target is None:  # the package itself: only its version
            continue
        if target == room:
            continue
        if floor[target] > floor[room]:  # floors are numbered from the top
            continue
        if (module, target) in KNOWN_EXCEPTIONS:
            used.add((module, target))
            continue
        side = "above" if floor[target] < floor[room] else "beside"
        wrong.append(f"{where}:{line}: {room} imports {target}, a room {side} it")
    assert not wrong, "imports against the floors (tests/test_layers.py FLOORS):\n" + \
        "\n".join(wrong)
    stale = set(KNOWN_EXCEPTIONS) - used
    assert not stale, f"these back-arrows are gone: remove them from KNOWN_EXCEPTIONS: {stale}"


def test_the_package_itself_is_read_only_for_its_version() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _room(_module_name(path)) is None:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "mechsink" and not node.level:
                names = {a.name for a in node.names if not _is_module(f"mechsink.{a.name}")}
                if names - ROOT_NAMES:
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {sorted(names)}")
    assert not wrong, "import these from their room, not from mechsink itself:\n" + \
        "\n".join(wrong)


# --- private attributes: only model/ reaches into TransformerLens and transformers ---------------

#: private reads outside model/ that are not of a TransformerLens or transformers object:
#: (module, expression) -> why it is allowed
ALLOWED_PRIVATE: dict[tuple[str, str], str] = {
    ("mechsink.errors", "sys._getframe"): "Python's own: the caller's frame for a warning",
    ("mechsink.measure.layer_stack", "torch.Tensor._make_wrapper_subclass"):
        "torch's protocol for a tensor subclass",
    ("mechsink.measure.layer_stack", "torch._C"): "torch's protocol for a tensor subclass",
    ("mechsink.viz.style", "fig._suptitle"): "matplotlib's figure title",
}


def _defined(tree: ast.AST) -> set[str]:
    """Every name a module defines itself: functions, classes, assignment targets (names and
    attributes, ``self._x = ...`` included), parameters and import aliases."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_reads(source: str) -> Iterator[tuple[int, str]]:
    """(line, expression) of every private attribute a module's ``source`` reads of an object
    that is not its own: ``x._name`` (``x`` not ``self`` / ``cls``) where the module defines no
    ``_name`` itself, and ``getattr`` / ``hasattr`` / ``setattr`` / ``delattr`` of such a
    literal name or of a computed name starting with ``_`` (``f"_{name}"``). Dunders are
    public."""
    tree = ast.parse(source)
    own = _defined(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in own:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                yield node.lineno, ast.unparse(node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
              and len(node.args) >= 2):
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                if _private(arg.value) and arg.value not in own:
                    yield node.lineno, ast.unparse(node)
            elif isinstance(arg, ast.JoinedStr) and arg.values and isinstance(
                    arg.values[0], ast.Constant) and str(arg.values[0].value).startswith("_"):
                yield node.lineno, ast.unparse(node)


def test_only_model_reads_private_attributes_of_library_objects() -> None:
    """Outside ``mechsink/model/`` no module reads a private attribute of an object it does not
    define (a TransformerLens or transformers module, or another module's object): that
    knowledge lives in ``model/`` behind a public function. A module's own objects' private
    attributes are its own business; :data:`ALLOWED_PRIVATE` lists the few reads of Python's,
    torch's and matplotlib's privates."""
    wrong, used = [], set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if _room(module) == "model":
            continue
        for line, expr in private_reads(path.read_text(encoding="utf-8")):
            if (module, expr) in ALLOWED_PRIVATE:
                used.add((module, expr))
                continue
            wrong.append(f"{path.relative_to(ROOT)}:{line}: {expr}")
    assert not wrong, "private attributes read outside mechsink/model/ (give model/ a public " \
        "function for it):\n" + "\n".join(wrong)
    assert not set(ALLOWED_PRIVATE) - used, \
        f"no longer read: remove from ALLOWED_PRIVATE: {set(ALLOWED_PRIVATE) - used}"


def test_the_private_read_check_flags_what_it_says() -> None:
    """The check on a module written for it: a library object's private attribute, a computed
    private name and another module's private function are flagged; the module's own private
    attributes, dunders and ``self._x`` are not."""
    source = '''
import engine
class Own:
    def __init__(self):
        self._mine = 1
    def read(self, other):
        return self._hidden, other._mine, type(other).__name__
def use(attn, model, name):
    a = attn._W_V
    b = getattr(model.blocks[0].attn, f"_{name}", None)
    c = getattr(model, "_b_K")
    d = engine._growth_hooks
    e = getattr(attn, "__class__")
    return a, b, c, d, e
'''
    found = [expr for _, expr in private_reads(source)]
    assert found == ["attn._W_V", "getattr(model.blocks[0].attn, f'_{name}', None)",
                     "getattr(model, '_b_K')", "engine._growth_hooks"], found


def test_no_room_imports_another_rooms_private_names() -> None:
    """``from mechsink.<room>... import _x`` and imports of a private module
    (``mechsink.measure.cache``) only within the room."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and not node.level and (
                    node.module or "").startswith("mechsink."):
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("mechsink.")]
            else:
                continue
            for name in names:
                if _room(name) != _room(module) and any(_private(p) for p in name.split(".")):
                    wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not wrong, "private names imported across rooms (make them public):\n" + \
        "\n".join(wrong)
