"""A griffe extension for the API pages: Sphinx roles (``:func:`x.y```) become cross-references
(plain code when the target is not on the site), and HTML in docstring prose is escaped so a
``<script>`` mentioned in a docstring cannot swallow the rest of the page.

mkdocstrings loads it from ``mkdocs.yml`` (``extensions:``); :func:`convert` is the whole idea,
usable on any text.
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Class, Extension, Object

from mechsink.viz.html_safe import text as html_text

ROLE = re.compile(r":(?:py:)?(?P<role>func|class|meth|mod|attr|data|exc|obj|const|ref|doc|"
                  r"term|envvar|option|program):`(?P<body>[^`]+)`")
LINKED = {"func", "class", "meth", "mod", "attr", "data", "exc", "obj", "const"}
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1", re.S)
FENCE = re.compile(r"^\s*(```|~~~)")
TAG_START = re.compile(r"<(?=[A-Za-z/!?])")


def _target(body: str) -> tuple[str, str]:
    """(title, identifier) of a role's body: ``~a.b`` -> (b, a.b), ``T <a.b>`` -> (T, a.b)."""
    body = body.strip().lstrip("!")
    explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^<>]+)>", body, re.S)
    if explicit:
        return explicit["title"], explicit["target"].lstrip("~.")
    if body.startswith("~"):
        return body[1:].rsplit(".", 1)[-1], body[1:].lstrip(".")
    return body, body.lstrip(".")


def _role(match: re.Match[str], scope: str) -> str:
    title, target = _target(match["body"])
    code = f"<code>{html_text(title)}</code>"
    if match["role"] not in LINKED:
        return code
    if "." not in target and scope:
        target = f"{scope}.{target}"
    return f'<autoref identifier="{html_text(target)}" optional>{code}</autoref>'


def _escape_prose(text: str) -> str:
    """``<`` that would open an HTML tag becomes ``&lt;``, outside code spans."""
    out, last = [], 0
    for m in CODE_SPAN.finditer(text):
        out.append(TAG_START.sub("&lt;", text[last:m.start()]))
        out.append(m.group(0))
        last = m.end()
    out.append(TAG_START.sub("&lt;", text[last:]))
    return "".join(out)


def convert(text: str, scope: str = "") -> str:
    """A docstring's Markdown with HTML escaped (outside code) and Sphinx roles turned into
    optional cross-references; ``scope`` qualifies a bare name (``:func:`f``` -> ``scope.f``)."""
    lines, fenced, chunk = [], False, []

    def flush() -> None:
        if chunk:
            prose = _escape_prose("\n".join(chunk))
            lines.append(ROLE.sub(lambda m: _role(m, scope), prose))
            chunk.clear()

    for line in text.split("\n"):
        stripped = line.lstrip()
        if FENCE.match(line):
            flush()
            fenced = not fenced
            lines.append(line)
        elif fenced or stripped.startswith((">>>", "... ")):
            flush()
            lines.append(line)
        else:
            chunk.append(line)
    flush()
    return "\n".join(lines)


class SphinxRoles(Extension):
    """Rewrites every docstring once it is loaded (see the module doc)."""

    def on_instance(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is None:
            return
        scope = obj.path if isinstance(obj, Class) else (obj.parent.path if obj.parent else "")
        obj.docstring.value = convert(obj.docstring.value, scope)
