"""Attention patterns of the strongest sink heads as one offline HTML page (circuitsvis).

circuitsvis ships its compiled JavaScript (``dist/cdn/iife.js``); we inline it once in the page
and render every head with ``CircuitsVis.render``, so the page needs no network. The patterns
come from census.json (``attention_example``: sequence 0, the top heads by sink score).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mechsink.errors import MissingDependencyError


def circuitsvis_js() -> str:
    """circuitsvis's bundled JavaScript, safe to inline in a <script> element."""
    try:
        import circuitsvis
    except ImportError as exc:
        raise MissingDependencyError(
            "the attention page needs circuitsvis: pip install circuitsvis"
        ) from exc
    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    if not path.is_file():
        raise MissingDependencyError(f"circuitsvis has no bundled JavaScript at {path}; "
                                     "reinstall circuitsvis.")
    js = path.read_text(encoding="utf-8")
    js = js.split("//# sourceMappingURL=")[0]  # the map is not shipped with the page
    return js.replace("</script", "<\\/script")


def full_pattern(lower: Sequence[Sequence[float | None]]) -> list[list[float]]:
    """A square causal pattern from its stored lower-triangular rows (row i: keys 0..i)."""
    t = len(lower)
    return [[(row[j] or 0.0) if j < len(row) else 0.0 for j in range(t)] for row in lower]


def attention_page(data: Mapping[str, Any]) -> str:
    """One HTML page: per suite x variant, the strongest sink heads on sequence 0."""
    sections, calls = [], []
    for i, run in enumerate(data["runs"]):
        ex = run["attention_example"]
        names = [f"L{h['layer']}H{h['head']} (sink {h['sink_score']:.2f})" for h in ex["heads"]]
        props = {"attention": [full_pattern(h["pattern"]) for h in ex["heads"]],
                 "tokens": ex["tokens"], "attentionHeadNames": names, "maskUpperTri": True}
        div = f"cv-{i}"
        sections.append(f"<h2>{html.escape(run['name'])}</h2>\n<div id=\"{div}\"></div>")
        calls.append(f"CircuitsVis.render({json.dumps(div)}, CircuitsVis.AttentionHeads, "
                     f"{json.dumps(props)});")
    title = html.escape(f"{data['model']}: strongest sink heads")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{title}</title>\n<style>body{{font-family:sans-serif;margin:2em}}</style>\n"
        f"</head><body>\n<h1>{title}</h1>\n<p>Sequence 0 of each input; heads with the highest "
        "mean sink score (Gu, key position 0). Click a head to enlarge it.</p>\n"
        + "\n".join(sections)
        + f"\n<script>\n{circuitsvis_js()}\n</script>\n<script>\n" + "\n".join(calls)
        + "\n</script>\n</body></html>\n"
    )


def write_attention_page(data: Mapping[str, Any], path: Path) -> Path:
    from mechsink.io import atomic_write_text

    atomic_write_text(path, attention_page(data))
    return path


def external_scripts(page: str) -> list[str]:
    """Every <script src=...> that points off the page (empty for an offline page)."""
    import re

    return re.findall(r"<script[^>]*\bsrc\s*=\s*[\"']?(?:https?:)?//[^\"'\s>]+", page, re.I)


def describe(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The heads shown on the page, per run (for the index)."""
    return [{"run": r["name"], "heads": [(h["layer"], h["head"], h["sink_score"])
                                         for h in r["attention_example"]["heads"]]}
            for r in data["runs"]]
