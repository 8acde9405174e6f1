"""Everything mechsink writes into HTML, escaped for where it goes.

Token strings, model names and prompts come from folders a user received (a hub model's
vocabulary is such a folder), so they are data that must never become markup or script:

- :func:`text`: element text and quoted attribute values (``&``, ``<``, ``>``, ``"``, ``'``);
- :func:`script_json`: a value as JSON inside a ``<script>`` element (also a
  ``type="application/json"`` one) or a ``.js`` file: ``<``, ``>`` and ``&`` are written as
  ``\\u003c``, ``\\u003e``, ``\\u0026`` (and U+2028/U+2029 escaped), so no ``</script>`` or
  ``<!--`` can appear in it, whatever the strings hold; JSON and JavaScript read the same value;
- :func:`script_code`: JavaScript mechsink ships (a bundled library) inlined in a page.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

__all__ = ["text", "script_json", "script_code"]

_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                   "\u2028": "\\u2028", "\u2029": "\\u2029"}
_TABLE = str.maketrans(_SCRIPT_ESCAPES)
_CLOSE = re.compile(r"</(script)", re.I)


def text(value: Any) -> str:
    """``value`` as text safe in an element's content or a quoted attribute value."""
    return html.escape(str(value), quote=True)


def script_json(value: Any, *, allow_nan: bool = True, ensure_ascii: bool = True) -> str:
    """``value`` as JSON that is safe inside a ``<script>`` element: no ``<``, ``>`` or ``&``
    appears in it (inside strings they are ``\\u`` escapes; outside strings JSON has none)."""
    return json.dumps(value, allow_nan=allow_nan, ensure_ascii=ensure_ascii).translate(_TABLE)


def script_code(source: str) -> str:
    """Trusted JavaScript (a library mechsink ships) made safe to inline in a ``<script>``
    element: every ``</script`` in it (any case) becomes ``<\\/script``, which reads the same
    inside a JavaScript string or regular expression, so it cannot end the element."""
    return _CLOSE.sub(lambda m: "<\\/" + m[1], source)
