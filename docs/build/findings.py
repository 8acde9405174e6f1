"""A page per finding: each experiment of :mod:`mechsink.experiments` opens with what it tests
and its key figure, then a verdict table (claim, verdict, criterion, what was measured, with the
intervals the experiment reports), the full summary folded away, and the command that made it;
plus a cross-model page (models x first-token variants) from the censuses. Everything is read
from the experiments' own ``result.json`` (and ``census.json``), so the pages re-render in
seconds from cached or committed results.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from docs.build.tables import cli_options, escape_cell_pipes, fmt, plain, summary_body


@dataclass(frozen=True)
class Finding:
    """One finding page: the experiment behind it, its title and what it tests (and whose)."""

    name: str  # the experiment of mechsink.experiments
    slug: str  # the page: findings/<slug>.md
    title: str
    tests: str  # one or two sentences: the claim and where it comes from


FINDINGS = (
    Finding("structural_origin", "chain", "The chain: super neurons make the sink (dose-response)",
            "Position 0 becomes the sink through a chain: the attention output at position 0 "
            "varies more than elsewhere, a small set of super neurons writes a massive channel "
            "there, and late-layer heads sink onto it. Scaling the super-neuron set by a dose "
            "(0 removes it, 1 is clean) should move the channel and the sink together (Li, "
            "Jiang, Sun et al. 2026, \"The Structural Origin of Attention Sink\")."),
    Finding("p0_sink", "p0-circuit", "The P0-sink circuit (path patching)",
            "Which heads and MLPs carry the sink at position 0, found by path patching, and "
            "whether it needs a BOS token (Peng, Li et al. 2026, \"How Attention Sinks Emerge "
            "in Large Language Models\")."),
    Finding("p0_edges", "edge-circuit", "The P0-sink circuit as an edge graph",
            "The same circuit as edges between components, found by edge attribution patching "
            "with integrated gradients (EAP-IG, Hanna, Pezzelle and Belinkov 2024, \"Have Faith "
            "in Faithfulness\"), checked against exact patching, with the faithfulness of the "
            "edge circuit next to the greedy node circuit's."),
    Finding("gpt2_query_bias", "query-bias-circuit", "The query-bias circuit of GPT-2-style models",
            "In GPT-2-style models the sink heads may not need the first token's content: the "
            "query and key biases alone could point every query at position 0. Each ablation "
            "below removes one ingredient and measures how much of the sink is kept."),
    Finding("query_bias_dose", "query-bias-dose",
            "The query-bias circuit, dosed (b_Q, b_Q . k_0, the layer-0 MLP, W_K)",
            "Does the query bias make key 0 win? Each part of the query-bias circuit is scaled "
            "over a dose grid with 95% intervals over prompts: all of b_Q (every query changes), "
            "only b_Q . k_0 in the logits of key 0 (every other logit untouched), the layer-0 MLP "
            "at position 0 and W_K's structure (claim C6 of the atlas)."),
    Finding("sink_free", "sink-free", "Sink-free attention variants",
            "Twin models trained with softmax and with each sink-free attention variant "
            "(softmax-plus-one, a sink logit, gated attention, softpick, sigmoid attention, a "
            "key-value bias): which variants remove the sink, and at what cost in loss."),
    Finding("seedprint", "seedprint", "SeedPrint: structure at random initialisation",
            "Untrained models already prefer some tokens and contract some directions; SeedPrint "
            "tells which random initialisation a model came from (Li, Tong, Wang et al. 2026)."),
    Finding("init_structure", "init-structure", "C7: structure at random initialisation",
            "Untrained models prefer some next tokens because representations contract (across "
            "sequences through the MLPs, within a sequence through attention), the bias "
            "fingerprints the seed (SeedPrint), and position 0 stands apart in the contraction: "
            "measured on random-init twins of real architectures, and on organisms trained from "
            "initialisations with that discrepancy removed or amplified (Li, Tong, Wang et al. "
            "2026)."),
    Finding("sink_timeline", "timeline", "The sink timeline during training",
            "The sink measurements at every checkpoint of a training run: when the sink appears "
            "and how it grows."),
    Finding("headwise_rmsnorm", "headwise-rmsnorm", "Head-wise RMSNorm",
            "Twin organisms trained with and without a head-wise RMSNorm on the attention "
            "output: does the norm speed convergence, and what does it do to the sink?"),
)
BY_NAME = {f.name: f for f in FINDINGS}


# --- verdicts ----------------------------------------------------------------------------------


def verdict_rows(data: Mapping[str, Any]) -> list[dict[str, str]]:
    """Every verdict in a result: ``{claim, verdict, criterion, measured}``.

    Experiments state verdicts in three shapes, all read here: a ``verdicts`` mapping of claim
    -> ``{verdict, criterion, evidence}``; any nested mapping holding a ``verdict`` (its other
    scalar fields are what was measured); a top-level ``verdict_<claim>`` string."""
    rows: list[dict[str, str]] = []
    for key, value in data.items():
        if key.startswith("verdict_") and isinstance(value, str):
            rows.append({"claim": key.removeprefix("verdict_").replace("_", " "),
                         "verdict": value, "criterion": "", "measured": ""})
    for path, node in _mappings(data, ()):
        if "verdict" in node and isinstance(node["verdict"], str):
            measured = node.get("evidence")
            if measured is None:
                measured = "; ".join(f"{k.replace('_', ' ')} {_short(v)}" for k, v in node.items()
                                     if k not in ("verdict", "criterion") and _short(v))
            rows.append({"claim": " / ".join(path), "verdict": node["verdict"],
                         "criterion": str(node.get("criterion", "")), "measured": str(measured)})
    return rows


def _mappings(node: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Mapping]]:
    if isinstance(node, Mapping):
        if path:
            yield path, node
        for k, v in node.items():
            if isinstance(v, Mapping | list):
                yield from _mappings(v, (*path, str(k)) if k != "verdicts" else path)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _mappings(v, (*path, str(i)))


def _short(v: Any) -> str:
    """A scalar or a short list as a table cell ('' for anything longer)."""
    if isinstance(v, int | float | str | bool) or v is None:
        return fmt(v)
    if isinstance(v, list) and len(v) <= 6 and all(isinstance(x, int | float) for x in v):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return ""


def _cell(text: str, *, markup: bool = False) -> str:
    """One table cell on one line, pipes escaped; ``text`` escaped as :func:`plain` unless it is
    ``markup`` the page builds itself."""
    text = str(text) if markup else plain(text)
    return escape_cell_pipes(" ".join(text.split()).replace("|", "\\|")) or "-"


def verdict_table(rows: list[dict[str, str]]) -> str:
    """The verdict table of a finding page (a caption line first)."""
    if not rows:
        return ("*This experiment states no verdict of its own: its figure and its main table "
                "are the result.*\n")
    lines = ["Table: verdicts, each with the criterion it was judged by and what was measured "
             "(intervals as the experiment reports them).", "",
             "| claim | verdict | criterion | measured |", "|---|---|---|---|"]
    lines += [f"| {_cell(r['claim'])} | **{_cell(r['verdict'])}** | {_cell(r['criterion'])} | "
              f"{_cell(r['measured'])} |" for r in rows]
    return "\n".join(lines) + "\n"


# --- pages -------------------------------------------------------------------------------------


def first_table(md: str) -> str:
    """The first Markdown table of ``md`` ('' if none)."""
    rows: list[str] = []
    for line in md.splitlines():
        if line.startswith("|"):
            rows.append(line)
        elif rows:
            break
    return "\n".join(rows) + "\n" if len(rows) >= 3 else ""


def command(name: str, model: str | None, settings: Mapping[str, Any]) -> str:
    """The ``mechsink experiment`` command that makes this result."""
    shown = {k: v for k, v in settings.items() if k not in ("work_dir", "run_dir")}
    parts = ["mechsink experiment", name, *([model] if model else []), "--out", f"runs/{name}"]
    options = cli_options(shown)
    return " ".join([*parts, options] if options else parts)


def _body_lines(f: Finding, result: Mapping[str, Any], summary_md: str, figures: list[str],
                model: str | None, assets: str, result_file: str, level: int) -> list[str]:
    """The finding, its key figure, the verdict table and the folded summary (headings at
    ``level``)."""
    rows = verdict_rows(result)
    on = f" on `{model}`" if model else ""
    lines: list[str] = []
    if rows:
        lines += [f"**Finding{on}.** " + "; ".join(
            f"{r['claim']}: **{r['verdict']}**" for r in rows[:4])
            + (f" (and {len(rows) - 4} more below)." if len(rows) > 4 else "."), ""]
    key = figures[0] if figures else None
    if key:
        lines += [f"![{f.title}]({assets}/{key})", "",
                  f"*Figure: the key figure of `{f.name}`{on}, drawn from its result.json.*", ""]
    body = summary_body(summary_md)
    lines += ["#" * level + " Verdicts" + (f" on `{model}`" if level > 2 and model else ""), "",
              verdict_table(rows), ""]
    if not rows and (table := first_table(body)):
        lines += ["Table: the experiment's main table (the first of its summary; intervals as "
                  "it reports them).", "", table, ""]
    lines += ['??? note "The full summary: settings and raw tables"', ""]
    lines += ["    " + line if line else "" for line in body.splitlines()]
    for extra in figures[1:]:
        lines += ["", f"    ![{extra}]({assets}/{extra})"]
    return [*lines, "", f"Data: [{result_file}]({assets}/{result_file}).", ""]


def finding_page(f: Finding, result: Mapping[str, Any], summary_md: str, figures: list[str],
                 model: str | None, settings: Mapping[str, Any], assets: str,
                 result_file: str = "result.json") -> str:
    """The Markdown of one finding page."""
    lines = [f"# {f.title}", "", f"**What is tested.** {f.tests}", ""]
    lines += _body_lines(f, result, summary_md, figures, model, assets, result_file, 2)
    lines += ["## How it was made", "", "```bash", command(f.name, model, settings), "```", ""]
    return "\n".join(lines)


@dataclass(frozen=True)
class Section:
    """One model's result on a multi-model finding page."""

    model: str
    anchor: str
    result: Mapping[str, Any]
    summary_md: str
    figures: list[str]
    assets: str
    result_file: str = "result.json"


def multi_model_page(f: Finding, sections: list[Section], made_by: str,
                     provenance: str, absent: list[tuple[str, str]] | None = None) -> str:
    """A finding page with a section per model (the atlas's): what is tested, the verdicts of
    every model side by side, then per model its finding, figure, verdicts and folded summary.
    ``made_by``: the command that made every section; ``provenance``: its date and commit;
    ``absent``: the atlas's models without this result, with the reason."""
    lines = [f"# {f.title}", "", f"**What is tested.** {f.tests}", "",
             "On " + ", ".join(f"[`{s.model}`](#{s.anchor})" for s in sections)
             + f", from the committed atlas. {provenance}", ""]
    if absent:
        lines += ["Not on this page: " + "; ".join(f"`{m}` ({_cell(why)})" for m, why in absent)
                  + ".", ""]
    claims = list(dict.fromkeys(r["claim"] for s in sections for r in verdict_rows(s.result)))
    top = [c for c in claims if " / " not in c]  # nested verdicts stay in each model's section
    claims = top or claims
    if claims:
        lines += ["Table: every model's verdicts side by side (the experiment's own claims; "
                  "each model's detailed verdicts, criteria and measurements are in its "
                  "section).", "",
                  "| claim | " + " | ".join(f"[`{s.model}`](#{s.anchor})" for s in sections)
                  + " |", "|---|" + "---|" * len(sections)]
        by_model = [{r["claim"]: r["verdict"] for r in verdict_rows(s.result)} for s in sections]
        lines += [f"| {_cell(c)} | " + " | ".join(_cell(v.get(c, "-")) for v in by_model) + " |"
                  for c in claims]
        lines.append("")
    for s in sections:
        lines += [f"## `{s.model}` {{ #{s.anchor} }}", ""]
        lines += _body_lines(f, s.result, s.summary_md, s.figures, s.model, s.assets,
                             s.result_file, 3)
    lines += ["## How it was made", "", "Every section comes from one atlas run:", "",
              "```bash", made_by, "```", ""]
    return "\n".join(lines)


def index_page(entries: list[tuple[Finding, list[dict[str, str]], str | None]]) -> str:
    """The findings overview: one row per finding with its first verdicts (``model``: the
    models' Markdown, None for a finding that trains its own)."""
    lines = ["# Findings", "",
             "One page per finding, each opening with what it tests and its key figure, then "
             "its verdicts; and a [cross-model page](cross-model.md) (models x first-token "
             "variants).", "",
             "Table: the findings and their first verdicts.", "",
             "| finding | models | verdicts (the first model's) |", "|---|---|---|"]
    for f, rows, model in entries:
        verdicts = "; ".join(f"{r['claim']}: {r['verdict']}" for r in rows[:3]) or "-"
        lines.append(f"| [{f.title}]({f.slug}.md) | {plain(model or 'trained here')} | "
                     f"{_cell(verdicts)} |")
    return "\n".join(lines) + "\n"


# --- the cross-model page ----------------------------------------------------------------------


def _runs(data: Mapping[str, Any], suite: str) -> dict[str, Mapping[str, Any]]:
    return {r["variant"]: r for r in data["runs"] if r["suite"] == suite}


def _max_head(run: Mapping[str, Any]) -> float | None:
    scores = [s for row in run["sink_score"] for s in row if s is not None]
    return max(scores) if scores else None


def story(model: str, runs: Mapping[str, Mapping[str, Any]], eps: float) -> str:
    """What the first-token variants say about one model, in a sentence, from its numbers."""
    rate = {v: r["sink_rate"] for v, r in runs.items()}
    bos, nobos, rand = rate.get("bos"), rate.get("nobos"), rate.get("randfirst")
    if bos is None or nobos is None:
        return f"`{model}`: not every first-token variant was measured."
    high = 0.5
    if max(v for v in rate.values() if v is not None) < 0.1:
        return (f"`{model}` hardly sinks on natural text with any first token (sink rate at most "
                f"{fmt(max(rate.values()))}, eps {eps}).")
    if bos >= high and nobos < 0.1:
        return (f"`{model}` sinks on its BOS token ({fmt(bos)}) and not without it "
                f"({fmt(nobos)}): the sink needs the token, not the position.")
    if nobos >= high and bos < 0.1:
        return (f"`{model}` sinks at position 0 without a BOS token ({fmt(nobos)}) but hardly "
                f"with it ({fmt(bos)}): its BOS token is not where this model's sink lives, so a "
                "BOS-only overview would call it sink-free.")
    if min(bos, nobos, rand if rand is not None else bos) >= high:
        return (f"`{model}` sinks at position 0 whatever comes first (BOS {fmt(bos)}, none "
                f"{fmt(nobos)}, random {fmt(rand)}): the position, not the token, draws it.")
    return (f"`{model}`: sink rate {fmt(bos)} with BOS, {fmt(nobos)} without, {fmt(rand)} with "
            "a random first token.")


def cross_model_page(census: Mapping[str, Mapping[str, Any]], suite: str = "natural",
                     flagged: Mapping[str, list[str]] | None = None) -> str:
    """Models x first-token variants: sink rate (and i >= 1), the strongest head's score, the
    per-layer range, and the story each row tells. ``flagged``: per model, the runs whose
    inputs hold no text (marked with a dagger, and their story says so)."""
    variants = ["bos", "nobos", "randfirst"]
    flagged = flagged or {}

    def mark(m: str, v: str) -> str:
        return " †" if f"{suite}/{v}" in flagged.get(m, []) else ""

    lines = ["# Across models: the first token", "",
             "The same census on every model, with each first-token variant: `bos` (the "
             "model's BOS token first), `nobos` (the text starts at position 0), `randfirst` (a "
             "random ordinary token first). A model whose sink only shows without its BOS "
             "token looks sink-free in a BOS-only overview.", ""]
    for m, d in census.items():
        bad = [r for r in flagged.get(m, []) if r.startswith(suite + "/")]
        note = (f" † Its {', '.join(f'`{r}`' for r in bad)} inputs are one repeated token, not "
                "text (its tokenizer cannot encode the corpus): these numbers do not describe "
                "text." if bad else "")
        lines.append(story(m, _runs(d, suite), d["settings"]["eps"]) + note + "\n")
    lines += ["", f"Table: sink rate at key 0 on {suite} text (Gu et al.'s, the share of heads "
              "whose mean sink score passes eps; `i >= 1` in brackets), per model and "
              "first-token variant.", "",
              "| model | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    for m, d in census.items():
        runs = _runs(d, suite)
        cells = [f"{fmt(runs[v]['sink_rate'])} ({fmt(runs[v]['sink_rate_no_self'])}){mark(m, v)}"
                 if v in runs else "-" for v in variants]
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    lines += ["", f"Table: the strongest head's mean sink score and the range of the per-layer "
              f"sink rate (lowest to highest layer) on {suite} text.", "",
              "| model | " + " | ".join(f"{v}: top head, layer range" for v in variants) + " |",
              "|---|" + "---|" * len(variants)]
    for m, d in census.items():
        runs = _runs(d, suite)
        cells = []
        for v in variants:
            r = runs.get(v)
            per_layer = [x for x in (r or {}).get("sink_rate_per_layer", []) if x is not None]
            cells.append("-" if r is None else f"{fmt(_max_head(r))}, "
                         f"[{fmt(min(per_layer) if per_layer else None)}, "
                         f"{fmt(max(per_layer) if per_layer else None)}]{mark(m, v)}")
        lines.append(f"| `{m}` | " + " | ".join(cells) + " |")
    lines += ["", "Data: each model's census.json (linked from its gallery page).", ""]
    return "\n".join(lines)


SHOWN_SUPER_WEIGHTS = 4  # the largest super weights named per model (a set may hold 60)
WEIGHT_QUANT_COLUMNS = (
    ("fp", "full precision"),
    ("int4_group", "int4, groups of 128"),
    ("int4_group_super_kept", "int4 g128, super kept"),
    ("int4_channel", "int4, per channel"),
    ("int4_channel_super_kept", "int4 per channel, super kept"),
    ("super_zeroed", "super weights zeroed"),
    ("top_super_zeroed", "top super weight zeroed"),
    ("super_kept_alone", "super kept alone"),
)


def _delta(row: Mapping[str, Any]) -> str:
    iv = row.get("delta_interval") or {}
    if "delta_loss" not in row:
        return ""
    return f" ({row['delta_loss']:+.3f} [{fmt(iv.get('low'))}, {fmt(iv.get('high'))}])"


def weight_quantization_page(results: Mapping[str, Mapping[str, Any]]) -> str:
    """The weight-only int4 page: per model the loss under each setting of
    :mod:`mechsink.interventions.weight_quantization` (its ``to_dict()``), the change from full
    precision with its interval, and the super weights it kept or zeroed."""
    lines = ["# Weight-only int4 and the super weight", "",
             "Every linear weight of the decoder quantized to int4 by round to nearest "
             "(asymmetric min-max, along the input dimension, in groups of 128 input channels "
             "or one group per output row), with the super weights quantized like the rest or "
             "kept in full precision; and, in full precision, the super weights zeroed alone "
             "(Yu et al. 2024, \"The Super Weight in Large Language Models\"), the top one "
             "(largest contribution to the channel) zeroed alone, or the super weights kept "
             "alone while the largest other weights are zeroed. The super weights are the "
             "down-projection entries joining the complete super-neuron sets to the massive "
             "channel at position 0.", "",
             "Table: mean next-token loss on natural text per setting; in brackets the change "
             "from full precision with its 95% interval over prompts.", "",
             "| model | " + " | ".join(t for _, t in WEIGHT_QUANT_COLUMNS) + " |",
             "|---|" + "---|" * len(WEIGHT_QUANT_COLUMNS)]
    for model, d in results.items():
        rows = d["settings"]
        cells = [f"{fmt(rows[k]['loss'])}{_delta(rows[k])}" if k in rows else "-"
                 for k, _ in WEIGHT_QUANT_COLUMNS]
        lines.append(f"| `{model}` | " + " | ".join(cells) + " |")
    lines += ["", "Table: the super weights (how many per block; the largest by magnitude as "
              "block, neuron -> channel, value) and what each run read.", "",
              "| model | super weights per block | largest | prompts | other weights zeroed |",
              "|---|---|---|---|---|"]
    for model, d in results.items():
        sws = d["super_weights"]
        blocks: dict[int, int] = {}
        for s in sws:
            blocks[s["layer"]] = blocks.get(s["layer"], 0) + 1
        per_block = ", ".join(f"L{b}: {n}" for b, n in sorted(blocks.items())) or "-"
        top = sorted(sws, key=lambda s: -abs(s["value"] or 0.0))[:SHOWN_SUPER_WEIGHTS]
        largest = ", ".join(f"L{s['layer']} N{s['neuron']}->{s['channel']} ({fmt(s['value'])})"
                            for s in top) or "-"
        p = d.get("prompts", {})
        lines.append(f"| `{model}` | {per_block} | {escape_cell_pipes(largest)} | {p.get('n')} x "
                     f"{p.get('seq_len')} tokens | {d.get('n_outliers_zeroed')} |")
    lines += ["", "Data: `docs/results/weight_quantization/<model>.json`.", ""]
    return "\n".join(lines)


def sink_protocol_page(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Gu et al.'s sink-rate table for every committed model (the ``data`` of
    :mod:`mechsink.experiments.sink_protocol`), in the published layout with the paper's rows
    quoted, then the version without query 0."""
    from mechsink.experiments.sink_protocol import PAPER, SUITES, percent, rate, table_lines

    first = next(iter(results.values()))["settings"]
    lines = ["# Sink rates under Gu et al.'s protocol", "",
             f"The sink rate at key position 0 as {PAPER} measure it: the share of heads whose "
             f"mean attention to the first token (queries i >= 0) exceeds eps = {first['eps']}, "
             f"thresholded per sequence, at T = {first['seq_len']}, on natural text, random "
             "tokens and one repeated token; each model with its BOS token first and without "
             f"it. n = {first['n']} sequences per suite; in brackets the 95% interval over "
             "sequences. The paper's rows are its own models (quoted, not measured here): the "
             "same protocol, other weights. The paper finds that one repeated token removes the "
             "sink of its LLaMA models; the rows above say where that holds here, with and "
             "without BOS. A rate of 0.0 [0.0, 0.0] is the same value on every sequence.", "",
             "Table: sink rate (%) at key 0, Gu's version.", "",
             *table_lines(results), "",
             "Table: sink rate (%) at key 0 without query 0 (queries i >= 1).", "",
             "| model | first token | " + " | ".join(SUITES) + " |",
             "|---|---|" + "---|" * len(SUITES)]
    for model, d in results.items():
        for variant, label in (("bos", "BOS"), ("nobos", "no BOS")):
            if rate(d, SUITES[0], variant) is None:
                continue
            lines.append(f"| `{model}` | {label} | " + " | ".join(
                percent(rate(d, s, variant, "sink_rate_no_self")) for s in SUITES) + " |")
    lines += ["", "BOS tokens: " + ", ".join(
        f"`{m}` " + ("none" if d["settings"].get("bos_token") is None
                     else _token(d["settings"]["bos_token"], table=False))
        for m, d in results.items())
        + ".", "",
        "Made by `mechsink experiment sink_protocol MODEL --out DIR` with "
        f"`{cli_options({k: first[k] for k in ('n', 'seq_len', 'eps')})}`; data: "
        "`docs/results/sink_protocol/<model>.json`.", ""]
    return "\n".join(lines)


SECONDARY_TOKENS = 8  # tokens named per model on the secondary-sink page


def _census_runs(results: Mapping[str, Mapping[str, Any]]) -> Iterator[tuple[str, Any]]:
    for model, d in results.items():
        for run in d["runs"]:
            yield model, run


def _token(text: str, *, table: bool = True) -> str:
    """A token as a page shows it: in a code span (which Markdown escapes, so a token is never
    read as HTML; a backtick inside would end the span and is shown as ``'``), whitespace made
    visible, pipes escaped in a table cell."""
    shown = repr(text)[1:-1] if text.strip() != text or not text else text
    span = "`" + shown.replace("`", "'") + "`"
    return escape_cell_pipes(span) if table else span


def secondary_sinks_page(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Secondary sinks on the committed census extracts
    (:func:`docs.build.results.census_extract`): how often a later key is a sink, how like the
    first token its state is, whether the massive channels fire there, and which tokens."""
    lines = ["# Secondary sinks: keys after position 0 that draw a sink", "",
             "A key k >= 1 is a secondary sink in a layer when some head's mean attention to it "
             "from the queries after it exceeds eps = 0.3 (Wong et al. 2026 find such sinks on "
             "delimiter and punctuation tokens). Only keys with at least a quarter of the "
             "sequence after them are scored: near the end a mean over a few queries is a "
             "previous-token head, not a sink. Per model: the share of scored (sequence, key) "
             "pairs that are a sink in some layer, how many such occurrences, over how many "
             "layers on average, the cosine of their residual state to the first token's "
             "(against other keys), and how often position 0's massive channels fire there.",
             "", "Table: secondary sinks per model and input.", "",
             "| model | input | rate | occurrences | mean layers | cosine to first (sinks / "
             "others) | massive channels fire |", "|---|---|---|---|---|---|---|"]
    for model, r in _census_runs(results):
        s = r["secondary_sinks"]
        cos = s.get("cosine_to_first") or {}
        lines.append(f"| `{model}` | {r['suite']}, {r['variant']}, {r['n']} x {r['seq_len']} | "
                     f"{fmt(s.get('rate'))} | {s.get('count')} | {fmt(s.get('mean_layers'))} | "
                     f"{fmt(cos.get('sinks'))} / {fmt(cos.get('other'))} | "
                     f"{s.get('massive_channels_fire')} |")
    lines += ["", "Table: the tokens that most often become secondary sinks (times a sink / "
              "times seen at a scored key).", "", "| model | tokens |", "|---|---|"]
    for model, r in _census_runs(results):
        toks = (r["secondary_sinks"].get("tokens") or [])[:SECONDARY_TOKENS]
        cells = ", ".join(f"{_token(t['token'])} {t['sinks']}/{t['occurrences']}" for t in toks)
        lines.append(f"| `{model}` | {cells or 'none'} |")
    lines += ["", _census_made(results), ""]
    return "\n".join(lines)


def dormant_heads_page(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Active and dormant sink heads on the committed census extracts: the value-weighted
    share of key 0 next to the attention-weight sink score (Guo et al. 2024)."""
    lines = ["# Active and dormant sink heads", "",
             "An attention-weight sink score says where a head looks, not what it writes. The "
             "value-weighted share of key 0, mean over queries i >= 1 of ||A[i,0] v_0|| / "
             "||sum_j A[i,j] v_j||, tells a head that parks its attention on the sink "
             "(dormant: a sink by weight, share below 0.3) from one that uses it (active) "
             "(Guo et al. 2024, \"Active-Dormant Attention Heads\"). Heads are classified per "
             "sequence; the share below is over every (sequence, layer, head) that is a sink.",
             "", "Table: sink heads per model: how many heads are sinks in at least half the "
             "sequences, the share of sink heads that are dormant, and how many heads are "
             "dormant in most of the sequences where they sink.", "",
             "| model | input | sink rate | sink heads | dormant share | mostly dormant |",
             "|---|---|---|---|---|---|"]
    for model, r in _census_runs(results):
        v = r["value_share"]
        lines.append(f"| `{model}` | {r['suite']}, {r['variant']}, {r['n']} x {r['seq_len']} | "
                     f"{fmt(r.get('sink_rate'))} | {v.get('sink_heads')} | "
                     f"{fmt(v.get('dormant_share'))} | {v.get('mostly_dormant')} |")
    lines += ["", "Table: the most dormant sink heads (layer.head: sink score, value share, "
              "fraction of its sink sequences in which it is dormant).", "",
              "| model | heads |", "|---|---|"]
    for model, r in _census_runs(results):
        heads = r["value_share"].get("heads") or []
        cells = "; ".join(f"L{h['layer']}.H{h['head']}: {fmt(h['sink_score'])}, "
                          f"{fmt(h['value_share'])}, {fmt(h['dormant_fraction'])}"
                          for h in heads[:5])
        lines.append(f"| `{model}` | {cells or 'none'} |")
    lines += ["", _census_made(results), ""]
    return "\n".join(lines)


def _census_made(results: Mapping[str, Mapping[str, Any]]) -> str:
    return ("Made by " + "; ".join(f"`{d['command']}`" for d in results.values())
            + ". Data: `docs/results/census/<model>.json`, what "
            "`docs.build.results.census_extract` keeps of each `census.json`. Qwen2.5 reads "
            "its text without BOS, as its tokenizer does: with `<|endoftext|>` first its sink "
            "rate drops to a few percent (the sink-protocol page).")


def streaming_page(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Streaming perplexity per model (the ``streaming.json`` of ``mechsink streaming``): a
    window of W recent tokens plus the first s kept, clean and with the sink circuit removed."""
    lines = ["# Streaming: what the kept first tokens and the sink circuit are worth", "",
             "StreamingLLM keeps the first tokens of a text in its KV window because evicting "
             "them breaks the model (Xiao et al. 2024, \"Efficient Streaming Language Models "
             "with Attention Sinks\"). Each token of the Wikipedia extract is predicted from the "
             "first s tokens of the text followed by the W tokens before it, positions "
             "re-assigned within the window (the window run afresh: the exact model of a cache "
             "holding those s + W tokens). Every setting scores the same tokens, those where "
             "every window is full. With the circuit removed, the complete super-neuron sets "
             "that write the massive channel are zeroed at the window's position 0: whether "
             "the kept tokens still help without the sink circuit tells whether the circuit is "
             "what streaming relies on.", ""]
    for model, d in results.items():
        windows, sinks = d["windows"], d["sinks"]
        removed = d.get("circuit_removed") or {}
        table = removed.get("table")
        lines += [f"## `{model}`", "",
                  f"{d['n_tokens']} tokens, {d['scored']} scored (from token "
                  f"{d['first_target']}); the whole text in one forward: perplexity "
                  f"{fmt(d['dense_perplexity'])}"
                  + (f", {fmt(removed['dense'])} with the circuit removed" if table else "")
                  + ". First tokens kept: " + ", ".join(_token(t, table=False)
                                                       for t in d["first_tokens"])
                  + ".", "",
                  "Table: perplexity per kept first tokens s (rows) and window W (columns)"
                  + ("; clean / with the circuit removed." if table else "."), "",
                  "| kept s | " + " | ".join(f"W = {w}" for w in windows) + " |",
                  "|---|" + "---|" * len(windows)]
        for s in sinks:
            cells = []
            for w in windows:
                clean = fmt(d["perplexity"][str(s)][str(w)])
                cells.append(f"{clean} / {fmt(table[str(s)][str(w)])}" if table else clean)
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
        if table:
            lines += ["", f"Circuit removed: {_neuron_counts(removed['description'])} (the "
                      "neurons themselves are in the JSON)."]
        elif removed.get("not_applicable"):
            lines += ["", f"Circuit not removed: {removed['not_applicable']}"]
        lines.append("")
    lines += ["Made by `mechsink streaming MODEL --out DIR --n-tokens N --window W ...` with "
              "each model's tokens and windows above, and `--no-bos` where its first tokens "
              "show no BOS (Qwen2.5's tokenizer adds none); data: "
              "`docs/results/streaming/<model>.json`.", ""]
    return "\n".join(lines)


def _neuron_counts(description: str) -> str:
    """A circuit edit's description with each list of neuron numbers replaced by its count
    (``MLP 3: [1414, 793, ...]`` -> ``MLP 3: 44 neurons``)."""
    import re

    def count(m: re.Match[str]) -> str:
        n = len([x for x in m.group(2).split(",") if x.strip()])
        return f"{m.group(1)}{n} neuron{'s' if n != 1 else ''}"

    return re.sub(r"(MLP \d+: )\[([^\]]*)\]", count, description)
