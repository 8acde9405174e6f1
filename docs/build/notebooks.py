"""Notebooks: parameters set, executed with nbclient, and turned into Markdown pages."""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mechsink.errors import MissingDependencyError
from mechsink.io import atomic_write_bytes


def set_parameters(nb: Any, params: Mapping[str, Any]) -> Any:
    """Replace the assignments of the cell tagged ``parameters`` with ``params``."""
    cells = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise ValueError("a notebook needs exactly one cell tagged 'parameters'")
    cell = cells[0]
    lines = cell.source.splitlines()
    for key, value in params.items():
        pattern = re.compile(rf"^{re.escape(key)}\s*=")
        hits = [i for i, line in enumerate(lines) if pattern.match(line)]
        if not hits:
            raise ValueError(f"the parameters cell has no {key} = ... line")
        lines[hits[0]] = f"{key} = {value!r}"
    cell.source = "\n".join(lines)
    return nb


def execute_notebook(path: Path, params: Mapping[str, Any], cwd: Path,
                     timeout: int = 900) -> Any:
    """Run a notebook with nbclient after setting its parameters; returns the executed notebook."""
    try:
        import nbformat
        from nbclient import NotebookClient
    except ImportError as exc:
        raise MissingDependencyError("executing notebooks needs nbclient, nbformat and "
                                     "ipykernel: pip install -e '.[docs]'") from exc
    nb = set_parameters(nbformat.read(path, as_version=4), params)
    env_cwd = str(cwd)
    with this_checkout_first():
        NotebookClient(nb, timeout=timeout, kernel_name="python3",
                       resources={"metadata": {"path": env_cwd}}).execute()
    return nb


@contextmanager
def this_checkout_first() -> Iterator[None]:
    """Put this checkout first on the kernel's ``PYTHONPATH`` for the block: a notebook runs in
    its own folder, where ``import mechsink`` would otherwise find whatever mechsink the
    environment installed (another checkout's, with an editable install), not the code this
    site documents."""
    root = str(Path(__file__).resolve().parents[2])
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = root + (os.pathsep + old if old else "")
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def _text(x: Any) -> str:
    return "".join(x) if isinstance(x, list) else str(x)


def _fence(text: str, lang: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}\n"


#: an inline script longer than this is a bundled library (circuitsvis's, about 1.3 MB), which
#: the site already loads from its own assets: it is dropped from embedded outputs
BUNDLE_CHARS = 100_000
_SCRIPT = re.compile(r"<script\b[^>]*>(.*?)</script>", re.S | re.I)
_OFF_PAGE = re.compile(r"""\b(?:src|href|action)\s*=\s*["']?\s*(?:[a-z][a-z0-9+.-]*:|//)|"""
                       r"""@import|url\(\s*["']?\s*(?:[a-z][a-z0-9+.-]*:|//)""", re.I)


def embeddable_html(page: str) -> str | None:
    """A notebook's HTML output ready to embed in a page (as a raw HTML block), or None when it
    refers to anything off the page (a script, stylesheet, image or link with a scheme or
    ``//``): then its text form is shown instead. Inline library bundles are dropped (the site
    serves circuitsvis itself; a view waits for it)."""
    body = _SCRIPT.sub(lambda m: "" if len(m.group(1)) > BUNDLE_CHARS else m.group(0), page)
    if _OFF_PAGE.search(body):
        return None
    caption = ("<p>Table: the output of the cell above, as the notebook shows it.</p>\n"
               if re.search(r"<table\b", body, re.I) else "")
    return (f'<div class="mechsink-nb-html" markdown="0" style="overflow-x:auto">\n{caption}'
            f"{body.strip()}\n</div>\n")


def notebook_markdown(nb: Any, files_dir: Path, files_url: str) -> str:
    """Markdown for an executed notebook: cells in order, outputs under their code; PNG outputs
    are written into ``files_dir`` and linked as ``files_url/NAME``; HTML outputs (circuitsvis
    views, tables) are embedded as they are (:func:`embeddable_html`), or, when they refer to
    anything off the page, shown in their text form."""
    parts, n_img = [], 0
    ansi = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(_text(cell.source) + "\n")
            continue
        if cell.cell_type != "code":
            continue
        parts.append(_fence(_text(cell.source), "python"))
        stdout: list[str] = []  # consecutive prints become one block; stderr (warnings,
        for out in [*cell.get("outputs", []), {"output_type": "end"}]:  # progress) is left out
            kind = out.get("output_type")
            if kind == "stream":
                if out.get("name") == "stdout":
                    stdout.append(ansi.sub("", _text(out.get("text", ""))))
                continue
            if stdout:
                parts.append(_fence("".join(stdout), "text"))
                stdout = []
            if kind in ("execute_result", "display_data"):
                data = out.get("data", {})
                if "image/png" in data:
                    n_img += 1
                    files_dir.mkdir(parents=True, exist_ok=True)
                    name = f"output-{n_img}.png"
                    atomic_write_bytes(files_dir / name, base64.b64decode(_text(data["image/png"])))
                    parts.append(f"![output {n_img}]({files_url}/{name})\n")
                elif "text/html" in data and (page := embeddable_html(_text(data["text/html"]))):
                    parts.append(page)
                elif "text/markdown" in data:
                    parts.append(_text(data["text/markdown"]) + "\n")
                elif "text/plain" in data:
                    parts.append(_fence(_text(data["text/plain"]), "text"))
            elif kind == "error":
                raise RuntimeError(f"notebook cell failed: {out.get('ename')}: {out.get('evalue')}")
    return "\n".join(parts)
