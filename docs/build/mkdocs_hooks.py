"""MkDocs hooks that make the built site work when opened from ``file://`` (no server).

- ``404.html`` gets relative links (MkDocs writes it with root-absolute ones, ``/assets/...``,
  which from ``file://`` point at the filesystem's root).
- Search works offline: Material loads ``search/search_index.js`` (a script defining
  ``__index``) instead of fetching the JSON when the page is a ``file:`` page, so it is written
  here; and since a browser refuses ``new Worker("file://...")``, every page loads a small shim
  first that starts Material's search worker from a ``blob:`` URL made of its source, which the
  shim's file carries as a string.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mechsink.viz.html_safe import script_json

SHIM = "assets/javascripts/mechsink-offline-search.js"
_BUNDLE = re.compile(r'<script src="(?P<prefix>[^"]*?)assets/javascripts/bundle\.[^"]+"')
_ROOT_ABSOLUTE = re.compile(r'\b(?P<attr>href|src)="/(?!/)')

_SHIM_JS = """\
/* mechsink: start Material's search worker from a blob: URL on file:// pages (a browser refuses
   a file:// worker); the worker's source is below. Served pages keep the ordinary worker. */
(function () {
  if (location.protocol !== "file:" || typeof Worker === "undefined") return;
  var source = %s;
  var Native = window.Worker;
  function OfflineWorker(url, options) {
    if (/workers\\/search\\.[^\\/]*\\.js$/.test(String(url))) {
      var blob = new Blob([source], {type: "text/javascript"});
      return new Native(URL.createObjectURL(blob), options);
    }
    return new Native(url, options);
  }
  OfflineWorker.prototype = Native.prototype;
  window.Worker = OfflineWorker;
})();
"""


def on_post_page(output: str, page: Any, config: Any, **kwargs: Any) -> str:
    """Load the offline-search shim before Material's bundle (which starts the worker)."""
    match = _BUNDLE.search(output)
    if not match:
        return output
    tag = f'<script src="{match["prefix"]}{SHIM}"></script>\n    '
    return output[: match.start()] + tag + output[match.start():]


def on_post_build(config: Any, **kwargs: Any) -> None:
    site = Path(config["site_dir"])
    index = site / "search" / "search_index.json"
    if index.is_file():
        data = json.loads(index.read_text(encoding="utf-8"))
        (site / "search" / "search_index.js").write_text(
            "var __index = " + _script_json(data) + ";\n", encoding="utf-8")
    workers = sorted((site / "assets" / "javascripts" / "workers").glob("search.*.min.js"))
    if workers:
        source = workers[0].read_text(encoding="utf-8")
        source = re.sub(r"//# sourceMappingURL=\S+\s*$", "", source)
        (site / SHIM).write_text(_SHIM_JS % _script_json(source), encoding="utf-8")
    not_found = site / "404.html"
    if not_found.is_file():
        text = _ROOT_ABSOLUTE.sub(lambda m: f'{m["attr"]}="', not_found.read_text("utf-8"))
        text = text.replace('"base": "/"', '"base": "."').replace('"search": "/', '"search": "')
        not_found.write_text(text, encoding="utf-8")


def _script_json(value: Any) -> str:
    """JSON that can sit inside a ``<script>`` or a .js file (``<``, ``>``, ``&`` escaped:
    nothing in it closes or opens anything)."""
    return script_json(value, ensure_ascii=False)
