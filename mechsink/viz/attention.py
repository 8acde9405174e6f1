"""Attention patterns in circuitsvis, offline: inline in Jupyter, or as one HTML page.

circuitsvis ships its compiled JavaScript (``dist/cdn/iife.js``, about 1.3 MB); we inline it in
the page, or in a notebook once per kernel (the first view's output carries it; later views
wait for it on the page, see :func:`reset_js`), and render every head with
``CircuitsVis.render``, so nothing loads from the network.
``mechsink.viz.attention(source, ...)`` (this module is callable: it calls :func:`attention`)
shows the patterns of a cache, a tensor or a census inline in Jupyter;
:func:`attention_page` writes the strongest sink heads of every census run as one page.
"""

from __future__ import annotations

import sys
import types
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechsink.errors import BadInputError, MissingDependencyError
from mechsink.viz.html_safe import script_code, script_json, text


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
    return script_code(js)


#: the colour circuitsvis draws an attention weight of 1 in (0 is white); given to every view so
#: the colour legend beside it is exact
POSITIVE_COLOUR = "#0072B2"
MASKED_COLOUR = "rgb(200,200,200)"  # circuitsvis's colour for the masked upper triangle
SCALE = {"maxValue": 1, "minValue": -1, "positiveColor": POSITIVE_COLOUR}


def colour_legend() -> str:
    """An HTML colour legend for circuitsvis attention views drawn with :data:`SCALE`: white
    (weight 0) to :data:`POSITIVE_COLOUR` (weight 1), and the grey of masked (later) keys.
    Inline styles only, so it reads the same in a notebook and on a page."""
    swatch = "display:inline-block;height:0.9em;vertical-align:middle;border:1px solid #999;"
    return ('<div class="mechsink-cv-legend" style="font-size:0.8rem;margin:0.3em 0">'
            "colour = attention weight of the query (row) on the key (column): "
            f'0 <span style="{swatch}width:9em;background:linear-gradient(to right,#ffffff,'
            f'{POSITIVE_COLOUR})"></span> 1 &nbsp; '
            f'<span style="{swatch}width:0.9em;background:{MASKED_COLOUR}"></span> '
            "masked (a key after the query)</div>")


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
                 "tokens": ex["tokens"], "attentionHeadNames": names, "maskUpperTri": True,
                 **SCALE}
        div = f"cv-{i}"
        sections.append(f"<h2>{text(run['name'])}</h2>\n{colour_legend()}\n"
                        f"<div id=\"{div}\"></div>")
        calls.append(f"CircuitsVis.render({script_json(div)}, CircuitsVis.AttentionHeads, "
                     f"{script_json(props)});")
    title = text(f"{data['model']}: strongest sink heads")
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


# --- inline views (Jupyter) --------------------------------------------------------------------


#: whether this kernel already sent circuitsvis's JavaScript in a view (see :func:`reset_js`)
_JS_SENT = False


def reset_js() -> None:
    """Inline circuitsvis's JavaScript again in the next view: after the output that carried it
    was cleared (the views after it then wait and say so)."""
    global _JS_SENT
    _JS_SENT = False


def _render_when_loaded(div: str, props: str) -> str:
    """JavaScript that renders into ``div`` once ``window.CircuitsVis`` is on the page (up to
    10 s), else says in the div how to bring the library back."""
    return (
        "(function(){var n=0;function go(){if(window.CircuitsVis){"
        f"CircuitsVis.render({script_json(div)}, CircuitsVis.AttentionHeads, {props});}}"
        "else if(n++<100){setTimeout(go,100);}else{"
        f"document.getElementById({script_json(div)}).textContent='circuitsvis is not loaded "
        "on this page (its script came with an earlier view whose output was cleared): run "
        "mechsink.viz.attention.reset_js() and show this view again.';}}go();})();")


@dataclass(frozen=True)
class AttentionView:
    """Attention patterns ready for circuitsvis: shows itself in Jupyter (``_repr_html_``,
    everything inlined, no network) and saves as a standalone page (:meth:`save`)."""

    patterns: list[list[list[float]]]  # head x query x key
    tokens: list[str]
    head_names: list[str]
    title: str = ""

    def __repr__(self) -> str:
        n = len(self.tokens)
        shown = ", ".join(self.head_names[:6]) + (", ..." if len(self.head_names) > 6 else "")
        return f"AttentionView({self.title or 'attention'!r}, {n} tokens, heads: {shown})"

    def props(self) -> dict[str, Any]:
        """What ``CircuitsVis.AttentionHeads`` is given."""
        return {"attention": self.patterns, "tokens": self.tokens,
                "attentionHeadNames": self.head_names, "maskUpperTri": True, **SCALE}

    def _body(self, div: str, *, with_js: bool = True) -> str:
        title = f"<b>{text(self.title)}</b>" if self.title else ""
        lib = f"<script>\n{circuitsvis_js()}\n</script>\n" if with_js else ""
        return (f"<div>{title}{colour_legend()}<div id=\"{div}\" class=\"mechsink-cv\"></div>"
                f"</div>\n{lib}<script>\n"
                + _render_when_loaded(div, script_json(self.props())) + "\n</script>")

    def _repr_html_(self) -> str:
        """The view for Jupyter: circuitsvis's JavaScript only in the kernel's first view."""
        global _JS_SENT
        first = not _JS_SENT
        _JS_SENT = True
        return self._body(f"mechsink-attn-{uuid.uuid4().hex[:12]}", with_js=first)

    def html(self) -> str:
        """A standalone offline HTML page (the JavaScript always inlined)."""
        title = text(self.title or "attention")
        return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
                f"<title>{title}</title></head><body>\n{self._body('mechsink-attn')}\n"
                "</body></html>\n")

    def save(self, path: str | Path) -> Path:
        """Write :meth:`html` to ``path`` atomically."""
        from mechsink.io import atomic_write_text

        return atomic_write_text(Path(path), self.html())


def attention(
    source: Any,
    tokens: Sequence[str] | Any = None,
    *,
    layer: int | None = None,
    heads: Sequence[int] | None = None,
    batch: int = 0,
    run: str | None = None,
    model: Any = None,
    title: str | None = None,
) -> AttentionView:
    """An inline circuitsvis view of attention patterns (renders in Jupyter, offline).

    ``source`` is one of: an ``ActivationCache`` or dict of activations (give ``layer``: its
    ``hook_pattern`` is shown, sequence ``batch``); a pattern tensor ``[head, query, key]``,
    ``[query, key]`` or ``[batch, head, query, key]``; a :class:`~mechsink.measure.census.Census`,
    one of its runs or census.json data (the strongest sink heads of ``run``, default the first).
    ``tokens``: token strings, or token ids with ``model`` (default: position numbers).
    ``heads`` picks heads (default all)."""
    import torch

    names: list[str]
    if hasattr(source, "runs"):  # a Census object
        source = source.to_dict()
    elif hasattr(source, "example") and hasattr(source, "prompts"):  # one RunCensus
        source = {"runs": [source.to_dict()]}
    if isinstance(source, Mapping) and "runs" in source:
        runs = list(source["runs"])
        if not runs:
            raise BadInputError("this census has no runs to show.")
        chosen = runs[0] if run is None else next((r for r in runs if r["name"] == run), None)
        if chosen is None:
            raise BadInputError(f"no run {run!r} in this census; it has "
                                f"{', '.join(r['name'] for r in runs)}.")
        ex = chosen["attention_example"]
        picked = ex["heads"] if heads is None else [ex["heads"][i] for i in heads]
        return AttentionView(
            [full_pattern(h["pattern"]) for h in picked], list(ex["tokens"]),
            [f"L{h['layer']}H{h['head']} (sink {h['sink_score']:.2f})" for h in picked],
            title or f"{source.get('model', '')} {chosen['name']}: strongest sink heads".strip())
    if isinstance(source, torch.Tensor):
        pattern = source.detach()
        if pattern.ndim == 4:
            pattern = pattern[batch]
        if pattern.ndim == 2:
            pattern = pattern.unsqueeze(0)
        if pattern.ndim != 3:
            raise BadInputError(f"a pattern tensor is [head, query, key], [query, key] or "
                                f"[batch, head, query, key]; got {pattern.ndim} dims.")
        prefix = "" if layer is None else f"L{layer}"
    else:
        if type(source).__name__ != "ActivationCache" and not isinstance(source, Mapping):
            raise BadInputError(
                f"attention() shows a cache, a pattern tensor or a census, not a "
                f"{type(source).__name__}.")
        from mechsink.model import act_name

        if layer is None:
            raise BadInputError("give layer=... to show a cache's attention pattern.")
        key = act_name("pattern", layer)
        try:
            full = source[key]
        except KeyError:
            raise BadInputError(f"the cache holds no {key}: run the model with that hook "
                                "cached (names_filter).") from None
        if not 0 <= batch < full.shape[0]:
            raise BadInputError(f"batch {batch} is outside 0..{full.shape[0] - 1}.")
        pattern = full[batch].detach()
        prefix = f"L{layer}"
    n_heads, seq = int(pattern.shape[0]), int(pattern.shape[-1])
    idx = list(range(n_heads)) if heads is None else [int(h) for h in heads]
    bad = [h for h in idx if not 0 <= h < n_heads]
    if bad:
        raise BadInputError(f"head {bad[0]} is out of range (0..{n_heads - 1}).")
    names = [f"{prefix}H{h}" for h in idx]
    if tokens is None:
        toks = [str(i) for i in range(seq)]
    elif isinstance(tokens, torch.Tensor) or (tokens and not isinstance(tokens[0], str)):
        if model is None:
            raise BadInputError("token ids need model=... to be turned into strings.")
        from mechsink.model import token_strings

        ids = tokens if isinstance(tokens, torch.Tensor) else torch.tensor(list(tokens))
        toks = token_strings(model, ids[batch] if ids.ndim == 2 else ids)
    else:
        toks = [str(t) for t in tokens]
    if len(toks) != seq:
        raise BadInputError(f"{len(toks)} tokens for a pattern over {seq} positions.")
    pats = pattern[idx].float().tolist()
    return AttentionView(pats, toks, names, title or "")


class _CallableModule(types.ModuleType):
    """``mechsink.viz.attention(...)`` calls :func:`attention`; the module stays a module."""

    def __call__(self, *args: Any, **kwargs: Any) -> AttentionView:
        return attention(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
