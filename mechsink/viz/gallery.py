"""Attention-pattern gallery: the strongest sink heads of a model beside a few ordinary heads.

:func:`choose_heads` picks the heads from a census (``census.json``); the docs build records
their patterns on one natural sequence into a gallery JSON (schema ``mechsink-gallery/1``) and
:func:`attention_block` renders a set of heads as an HTML fragment for a page that loads
circuitsvis's bundled JavaScript (``CircuitsVis`` global, see
:func:`mechsink.viz.attention.circuitsvis_js`). Nothing here touches a model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from mechsink.viz.attention import SCALE, colour_legend, full_pattern
from mechsink.viz.html_safe import script_json, text

GALLERY_SCHEMA = "mechsink-gallery/1"


def reference_run(data: Mapping[str, Any]) -> dict[str, Any]:
    """The census run heads are chosen from: natural text with BOS if present, else the first
    natural run, else the first run."""
    runs = data["runs"]
    for want in (("natural", "bos"), ("natural", None)):
        for r in runs:
            if r["suite"] == want[0] and (want[1] is None or r["variant"] == want[1]):
                return r
    return runs[0]


def choose_heads(
    data: Mapping[str, Any], n_sink: int = 4, n_ordinary: int = 3
) -> dict[str, list[tuple[int, int, float]]]:
    """``{"sink": [...], "ordinary": [...]}`` as (layer, head, mean Gu sink score).

    Sink heads: the highest mean sink score of :func:`reference_run`. Ordinary heads: the lowest
    scores, at most one per layer, spread over the depth (they show what a head that does *not*
    sink looks like on the same text).
    """
    scores = reference_run(data)["sink_score"]
    flat = [(layer, head, float(s)) for layer, row in enumerate(scores)
            for head, s in enumerate(row) if s is not None]
    by_score = sorted(flat, key=lambda t: (-t[2], t[0], t[1]))
    sink = by_score[:n_sink]
    taken = {(layer, head) for layer, head, _ in sink}
    lowest_per_layer: dict[int, tuple[int, int, float]] = {}
    for layer, head, s in sorted(flat, key=lambda t: (t[2], t[0], t[1])):
        if (layer, head) not in taken and layer not in lowest_per_layer:
            lowest_per_layer[layer] = (layer, head, s)
    candidates = sorted(lowest_per_layer.values(), key=lambda t: (t[2], t[0]))
    ordinary = sorted(candidates[: max(n_ordinary, 0)], key=lambda t: (t[0], t[1]))
    if len(ordinary) < n_ordinary:  # few layers: allow several heads of one layer
        rest = [t for t in sorted(flat, key=lambda t: (t[2], t[0], t[1]))
                if (t[0], t[1]) not in taken and t not in ordinary]
        ordinary = sorted(ordinary + rest[: n_ordinary - len(ordinary)], key=lambda t: t[:2])
    return {"sink": sink, "ordinary": ordinary}


def attention_block(element_id: str, tokens: Sequence[str],
                    heads: Sequence[Mapping[str, Any]], title: str = "") -> str:
    """An HTML fragment: a circuitsvis ``AttentionHeads`` view of ``heads`` (each with layer,
    head, sink_score and a lower-triangular ``pattern``), rendered when the page has loaded.

    The page must load circuitsvis's JavaScript (any place in the page; rendering waits for
    ``DOMContentLoaded``). The fragment itself contains no URL.
    """
    props = {
        "attention": [full_pattern(h["pattern"]) for h in heads],
        "tokens": list(tokens),
        "attentionHeadNames": [f"L{h['layer']}H{h['head']} (sink {h['sink_score']:.2f})"
                               for h in heads],
        "maskUpperTri": True, **SCALE,
    }
    eid = text(element_id)
    caption = f"<p><strong>{text(title)}</strong></p>\n" if title else ""
    return (
        f'<div class="mechsink-attention" markdown="0">\n{caption}{colour_legend()}\n'
        f'<div id="{eid}" class="mechsink-cv"></div>\n'
        f'<script type="application/json" id="{eid}-data">{script_json(props)}</script>\n'
        "<script>\ndocument.addEventListener(\"DOMContentLoaded\", function () {\n"
        f"  var props = JSON.parse(document.getElementById({script_json(element_id + '-data')})"
        ".textContent);\n"
        f"  CircuitsVis.render({script_json(element_id)}, CircuitsVis.AttentionHeads, props);\n"
        "});\n</script>\n</div>\n"
    )


def code_span(value: str) -> str:
    """``value`` as a Markdown code span, which shows any text literally (HTML included): its
    fence is one backtick longer than the longest run of backticks in it."""
    value = str(value)
    runs = [len(r) for r in re.findall("`+", value)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if value.startswith("`") or value.endswith("`") else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def flagged_runs(gallery: Mapping[str, Any]) -> list[str]:
    """The census runs whose inputs hold no text (the gallery JSON's ``inputs``: one token id
    throughout, or one id after the first position), in census order."""
    return [run for run, info in (gallery.get("inputs") or {}).items() if info.get("identical")]


def inputs_warning(gallery: Mapping[str, Any]) -> str:
    """A Markdown warning naming the flagged runs (empty when there are none): their numbers
    measure a sequence of one repeated token, not text."""
    runs = flagged_runs(gallery)
    if not runs:
        return ""
    listed = ", ".join(f"{code_span(r)} ({gallery['inputs'][r]['distinct_tokens']:d} "
                       "distinct token id"
                       f"{'s' if gallery['inputs'][r]['distinct_tokens'] != 1 else ''})"
                       for r in runs)
    return ('!!! warning "Inputs without text"\n'
            f"    These runs' inputs are one token repeated, not text: {listed}. Their numbers "
            "describe that degenerate input (the model's tokenizer cannot encode the corpus), "
            "so read them as such.\n")


def gallery_blocks(gallery: Mapping[str, Any], prefix: str = "cv") -> str:
    """The sink heads and the ordinary heads of a gallery JSON, as two attention blocks; a
    warning instead when the sequence is one repeated token (nothing to read as text)."""
    if gallery.get("schema") != GALLERY_SCHEMA:
        raise ValueError(f"not a {GALLERY_SCHEMA} document (schema {gallery.get('schema')!r})")
    if gallery.get("identical"):
        tokens = gallery["tokens"]
        return ('!!! warning "No text to show"\n'
                f"    The {code_span(gallery['run'])} sequence of this model is {len(tokens)} "
                f"tokens with no text in them ({code_span(tokens[0])} then "
                f"{'the same token' if len(set(tokens[1:])) == 1 else 'one token repeated'}): "
                "its tokenizer cannot encode the natural-text corpus. The attention views are "
                "left out; the census's other suites still measure the model.\n")
    out = []
    for kind, title in (("sink", "Strongest sink heads"),
                        ("ordinary", "Ordinary heads (lowest sink score), for contrast")):
        heads = [h for h in gallery["heads"] if h["kind"] == kind]
        if heads:
            out.append(attention_block(f"{prefix}-{kind}", gallery["tokens"], heads, title))
    return "\n".join(out)
