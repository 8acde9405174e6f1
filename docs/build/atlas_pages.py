"""The pages a committed atlas feeds (:mod:`docs.build.results`): the home page's atlas table
(claims x models; per cell the verdict, its key number with interval, the criterion, a link to
the finding page's section for that model), the per-model sections of the chain, P0-circuit and
query-bias finding pages, and the cross-model page (the atlas's first-token table).
Everything is read from the committed JSON; nothing here runs a model."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from docs.build.cache import slug
from docs.build.findings import BY_NAME, _cell, plain, story
from docs.build.results import STEP_MARKER, CommittedAtlas, list_or

NUM = r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
INTERVAL = re.compile(rf"{NUM} \[{NUM}, {NUM}\]")
SHORT = 70  # evidence up to this long is shown whole in a cell
CLAIM_STEP = {"C1": "structural_origin", "C2": "structural_origin", "C3": "structural_origin",
              "C4": "structural_origin", "C5": "p0_sink", "C6": "query_bias_dose"}
VARIANTS = ("bos", "nobos", "randfirst")
#: the claims whose experiment traces the sink on one first-token variant (C1's variance part
#: reads its own inputs)
TRACED_CLAIMS = ("C2", "C3", "C4", "C5", "C6")


def traced_variant(atlas: CommittedAtlas, row: Mapping[str, Any],
                   steps: tuple[str, ...] = ("structural_origin", "p0_sink")) -> str:
    """The first token a model's causal-chain steps (the first of ``steps`` that holds a
    result) traced the sink on (``bos`` unless the model has no sink behind BOS; a result
    older than that choice traced on ``bos``)."""
    for step in steps:
        folder = atlas.step(row, step)
        if folder is not None:
            data = json.loads((folder / "result.json").read_text(encoding="utf-8"))
            return str(data.get("traced_variant") or "bos")  # None: a task organism
    return "bos"


def traced_note(atlas: CommittedAtlas) -> str:
    """One sentence naming the models traced without BOS, with their first-token sink rates
    ('' when every model was traced with BOS)."""
    off = []
    for m in atlas.data["models"]:
        variant = traced_variant(atlas, m)
        if variant != "bos":
            rates = {v: m["first_token"].get(f"natural/{v}", {}).get("mean") for v in VARIANTS}
            shown = ", ".join(f"{v} {r:.3f}" for v, r in rates.items() if r is not None)
            off.append(f"`{plain(m['model'])}` on {variant} (natural-text sink rate at key 0: "
                       f"{shown})")
    if not off:
        return ""
    return ("C2-C6 trace the sink with BOS first, except where a model has no sink behind BOS: "
            + "; ".join(off) + ".")


def anchor(model: str) -> str:
    """The id of a model's section on a finding page."""
    return f"model-{slug(model).lower()}"


def key_figure(evidence: str) -> str:
    """The key number of a cell's evidence, with its interval where the evidence gives one: the
    whole evidence when short, else its first part holding an interval, else its first part
    holding a change (``->``), else its first part."""
    text = " ".join(str(evidence).split())
    if len(text) <= SHORT:
        return text
    parts = [p.strip() for p in text.split("; ") if p.strip()]
    pick = (next((p for p in parts if INTERVAL.search(p)), None)
            or next((p for p in parts if "->" in p), None) or parts[0])
    return pick if len(pick) <= 2 * SHORT else pick[: 2 * SHORT - 1] + "…"


def finding_link(claim: str, cell: Mapping[str, Any], model: str, prefix: str) -> str | None:
    """Where a cell links: its finding page's section for the model (None without a run)."""
    step = CLAIM_STEP.get(claim)
    if not cell.get("link") or step is None:
        return None
    return f"{prefix}findings/{BY_NAME[step].slug}.md#{anchor(model)}"


def provenance(atlas: CommittedAtlas) -> str:
    """One paragraph: the command, its date, the mechsink commit and version that made it."""
    e = atlas.entry
    commit = e.get("mechsink_commit") or "unknown"
    commit = f"commit `{commit[:12]}`" if re.fullmatch(r"[0-9a-f]{40}", commit) else commit
    return (f"Made by `{e.get('command')}` on {str(e.get('made', '?'))[:10]} (mechsink "
            f"{e.get('mechsink_version', '?')}, {commit}); committed under "
            f"`docs/results/{atlas.name}/` and drawn from its JSON when the site is built "
            "(no model runs).")


def _criterion(cells: list[Mapping[str, Any]]) -> str:
    seen = Counter(c["criterion"] for c in cells if c.get("criterion", "-") != "-")
    return seen.most_common(1)[0][0] if seen else "-"


#: a verdict's colour class on the home page's grid (docs/assets/css/mechsink.css)
VERDICT_CLASS = {"supported": "v-yes", "partial": "v-partial", "not supported": "v-no",
                 "not applicable": "v-na"}
GRID_NUMBER = 34  # a grid cell's number is at most about this long (its interval kept)
ARROW = re.compile(rf"({NUM}(?: \[{NUM}, {NUM}\](?: n=\d+)?)?)\s*(?:[a-z]+\s*)?->\s*({NUM})")


def grid_number(evidence: str) -> str:
    """The grid's short form of a cell's key number (:func:`key_figure`): asides in parentheses
    and every interval after the first dropped; a change ``a -> b`` with the up to three words
    naming it; else the leading parts that fit :data:`GRID_NUMBER` characters."""
    text = re.sub(r"\s*\([^)]*\)", "", key_figure(evidence)).strip()
    first = re.search(rf"{INTERVAL.pattern}(?: n=\d+)?", text)
    if first is not None:  # later intervals go: the evidence further down keeps them
        tail = re.sub(rf" \[{NUM}, {NUM}\](?: n=\d+)?", "", text[first.end():])
        text = text[:first.end()] + tail
    change = ARROW.search(text)
    if change is not None:
        label = " ".join(text[:change.start()].replace(":", " ").split()[-3:])
        return f"{label} {change.group(1)} → {change.group(2)}".strip()
    if len(text) <= GRID_NUMBER:
        return text
    parts = [p for p in re.split(r"(?<=[;,]) (?![^\[]*\])", text) if p]  # not in [..]
    out = parts[0]
    for part in parts[1:]:
        if len(out) + 1 + len(part) > GRID_NUMBER:
            break
        out = f"{out} {part}"
    out = out.rstrip(";,")
    return out if len(out) <= 2 * GRID_NUMBER else out[:2 * GRID_NUMBER - 1] + "…"


def _badge(verdict: str, link: str | None) -> str:
    """A verdict as a coloured badge (a link to its finding section when there is one)."""
    cls = VERDICT_CLASS.get(verdict, "v-na")
    text = plain(verdict)
    return (f"[**{text}**]({link}){{ .mechsink-verdict .{cls} }}" if link
            else f"**{text}**{{ .mechsink-verdict .{cls} }}")


def home_section(atlas: CommittedAtlas, prefix: str = "") -> str:
    """The home page's atlas: a grid of claims x models, each cell a colour-coded verdict
    (linked to the finding page's section for that model) and the one number it rests on;
    the claims and their criteria are listed under it, and :func:`evidence_section` writes
    every cell out further down the page."""
    data = atlas.data
    models = data["models"]
    s = data["settings"]
    lines = ["## The sink atlas: every claim on every model", "",
             f"Each claim tested on each model with the same prompts and settings (n = {s['n']} "
             f"prompts of {s['seq_len']} tokens"
             + (f", {s['n_census']} sequences per suite for the first-token table, the "
                "trained sink rate and C7" if "n_census" in s else "")
             + f", seed {s['seed']}, sink threshold eps = "
             f"{s['eps']}). {provenance(atlas)}", "",
             "Table: the atlas. Each cell: the verdict (green supported, amber partial, red not "
             "supported, grey not applicable; linked to the finding page's section for that "
             "model) and the number it rests on, with its 95% interval over prompts where the "
             "experiment gives one (&dagger;: judged by its own criterion, given with its "
             "evidence). The claims and their criteria are listed under the grid, every "
             "cell's full evidence [further down](#atlas-evidence).", "",
             "| claim | " + " | ".join(f"`{m['model']}`" for m in models) + " |",
             "|---|" + "---|" * len(models)]
    criteria = []
    for claim, what in data["claims"].items():
        cells = [m["cells"][claim] for m in models]
        common = _criterion(cells)
        criteria.append(f"- **{claim}** ({what}): {plain(common)}.")
        out = []
        for m, c in zip(models, cells, strict=True):
            badge = _badge(c["verdict"], finding_link(claim, c, m["model"], prefix))
            own = "" if c.get("criterion", "-") in ("-", common) else " &dagger;"
            out.append(_cell(f"{badge}{own}<br>{plain(grid_number(c['evidence']))}",
                             markup=True))
        lines.append(f"| [{claim}](#atlas-{claim.lower()}) | " + " | ".join(out) + " |")
    lines += ["", "The claims and their criteria (the verdicts above are judged by them):", "",
              *criteria]
    note = traced_note(atlas)
    if note:
        lines += ["", note]
    if atlas.previous is not None:
        lines += ["", f"The verdicts that changed from the previous atlas "
                  f"({_settings_text(atlas.previous['settings'])}) are listed "
                  "[at the end of this page](#atlas-changes)."]
    lines += ["", "The sink rate of every model on every prompt suite and first token is on "
              f"[the cross-model page]({prefix}findings/cross-model.md).", ""]
    return "\n".join(lines)


def evidence_section(atlas: CommittedAtlas) -> str:
    """Every atlas cell written out: per claim and model, the verdict, the criterion and what
    was measured (the home page's table links here)."""
    data = atlas.data
    models = data["models"]
    lines = ["## The atlas, cell by cell: criteria and evidence { #atlas-evidence }", ""]
    for claim, what in data["claims"].items():
        lines += [f"### {claim}: {what} {{ #atlas-{claim.lower()} }}", ""]
        for m in models:
            c = m["cells"][claim]
            lines.append(f"- `{m['model']}`: **{plain(c['verdict'])}**. Criterion: "
                         f"{plain(c['criterion'])}. Measured: {plain(c['evidence'])}.")
        lines.append("")
    return "\n".join(lines)


#: how a verdict's move reads: a finding present before and absent now is gone
STRENGTH = {"supported": 2, "partial": 1, "not supported": 0}


def _settings_text(s: Mapping[str, Any]) -> str:
    census = f", {s['n_census']} per suite for the census-type cells" if "n_census" in s else ""
    return f"n = {s['n']} prompts of {s['seq_len']} tokens{census}"


def _move(before: str, after: str) -> str:
    """What a verdict's change means: gone (weaker, down to not supported), weaker, stronger,
    new (from not supported), or a change of kind (to or from not applicable)."""
    b, a = STRENGTH.get(before), STRENGTH.get(after)
    if b is None or a is None:
        return "not comparable"
    if a < b:
        return "gone" if a == 0 else "weaker"
    return "new" if b == 0 else "stronger"


def changes(atlas: CommittedAtlas) -> list[dict[str, str]]:
    """Every cell of a model in both atlases whose verdict differs from the atlas this one
    replaced, in claim order: claim, model, the verdicts and evidence before and now, and what
    the move means (:func:`_move`) and why it moved (the criterion changed, or the same
    criterion at other settings)."""
    prev = atlas.previous
    if prev is None:
        return []
    out = []
    settings = _settings_change(prev["settings"], atlas.data["settings"])
    variants: dict[tuple[str, str], str] = {}  # (model, step) -> traced variant, read once
    for claim in atlas.data["claims"]:
        for m in atlas.data["models"]:
            old = prev["cells"].get(m["model"], {}).get(claim)
            new = m["cells"].get(claim)
            if old is not None and new is not None and old["verdict"] != new["verdict"]:
                variant = "bos"
                if claim in TRACED_CLAIMS:
                    key = (m["model"], CLAIM_STEP[claim])
                    if key not in variants:
                        variants[key] = traced_variant(atlas, m, (CLAIM_STEP[claim],))
                    variant = variants[key]
                traced = f"traced on {variant} (no sink behind BOS)"
                if old.get("criterion") != new.get("criterion"):
                    why = "the criterion changed" + (f"; {traced}" if variant != "bos" else "")
                else:
                    why = (f"{traced}, at {settings}" if variant != "bos"
                           else f"the same criterion at {settings}")
                out.append({"claim": claim, "model": m["model"], "before": old["verdict"],
                            "now": new["verdict"], "move": _move(old["verdict"],
                                                                 new["verdict"]),
                            "why": why, "evidence_before": old["evidence"],
                            "evidence_now": new["evidence"]})
    return out


def _settings_change(before: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """The settings that differ, ``n 4 -> 16, seq_len 32 -> 64`` (or "the same settings")."""
    keys = [k for k in ("n", "seq_len", "n_census", "seed", "eps")
            if list_or(before.get(k)) != list_or(now.get(k))]
    return ", ".join(f"{k} {before.get(k, '-')} → {now.get(k, '-')}" for k in keys) \
        or "the same settings"


def changes_section(atlas: CommittedAtlas) -> str:
    """Which verdicts changed from the atlas this one replaced (a finding that did not hold at
    the new settings is listed as gone, not dropped), with both evidences, and the models only
    one of the two holds, with their earlier verdicts ('' when no earlier atlas was kept)."""
    prev = atlas.previous
    if prev is None:
        return ""
    moved = changes(atlas)
    now = {m["model"]: m for m in atlas.data["models"]}
    compared = sum(1 for name, m in now.items() for c in m["cells"]
                   if c in prev["cells"].get(name, {}))
    same_n = list_or(prev["settings"].get("n")) == list_or(atlas.data["settings"].get("n"))
    before = _settings_text(prev["settings"])
    lines = ["## What changed from the previous atlas { #atlas-changes }", "",
             f"The atlas before this one was made at {before} "
             f"({str(prev.get('made') or '?')[:10]}); this one at "
             f"{_settings_text(atlas.data['settings'])}. Of the {compared} cells both hold, "
             f"{compared - len(moved)} kept their verdict. A verdict marked *gone* was a "
             "finding before and is not supported now: "
             + ("at the larger sample it did not hold" if not same_n else
                "it did not hold when measured again") + " (or its criterion changed, as the "
             "*why* column says); *new* is the reverse.", ""]
    for name, cells in prev["cells"].items():
        if name not in now:
            lines += [f"`{name}` is not in this atlas (not run at its settings); its verdicts "
                      f"at {before}: " + ", ".join(f"{claim} {cell['verdict']}"
                                                  for claim, cell in cells.items()) + ".", ""]
    added = [name for name in now if name not in prev["cells"]]
    if added:
        lines += ["New in this atlas: " + ", ".join(f"`{a}`" for a in added) + ".", ""]
    if not moved:
        return "\n".join([*lines, "No verdict of a model in both changed.", ""])
    lines += ["Table: the verdicts that changed, with the evidence each rests on.", "",
              "| claim | model | before | now | change | why | evidence before | evidence now |",
              "|---|---|---|---|---|---|---|---|"]
    for c in moved:
        lines.append(f"| {c['claim']} | `{c['model']}` | {_cell(c['before'])} | "
                     f"{_cell(c['now'])} | *{c['move']}* | {c['why']} | "
                     f"{_cell(key_figure(c['evidence_before']))} | "
                     f"{_cell(key_figure(c['evidence_now']))} |")
    return "\n".join([*lines, ""])


def _rate(v: Mapping[str, Any] | None) -> tuple[str, str | None]:
    """A first-token cell (``mean [low, high]``) and the note of a zero-width interval."""
    if not v or "mean" not in v:
        return (f"n/a ({v['not_applicable']})" if v and "not_applicable" in v else "-"), None
    text = f"{v['mean']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"
    return (text + " ‡", v["note"]) if v.get("note") else (text, None)


def cross_model_section(atlas: CommittedAtlas) -> str:
    """The cross-model page from the atlas: per suite, models x first-token variants (sink rate
    at key 0 with its interval over prompts), and the story of each model's natural-text row."""
    data = atlas.data
    models = data["models"]
    eps = data["settings"]["eps"]
    suites = list(dict.fromkeys(k.split("/")[0] for m in models for k in m["first_token"]))
    lines = ["# Across models: the first token", "",
             "The atlas's sink rate at key 0 (Gu et al.'s: the share of heads whose sink score "
             f"passes eps = {eps}; mean and 95% interval over prompts) of every model on every "
             "prompt suite, with each first-token variant: `bos` (the model's BOS token first), "
             "`nobos` (the text starts at position 0), `randfirst` (a random ordinary token "
             "first). A model whose sink only shows without its BOS token looks sink-free in a "
             f"BOS-only overview. {provenance(atlas)}", ""]
    for m in models:
        runs = {v: {"sink_rate": m["first_token"].get(f"natural/{v}", {}).get("mean")}
                for v in VARIANTS}
        lines.append(story(m["model"], runs, eps) + "\n")
    notes: dict[str, int] = {}
    for suite in suites:
        lines += ["", f"Table: sink rate at key 0 on {suite} input, per model and first token "
                  "(‡: the interval has zero width, see below).", "",
                  "| model | " + " | ".join(VARIANTS) + " |", "|---|" + "---|" * len(VARIANTS)]
        for m in models:
            cells = []
            for v in VARIANTS:
                text, note = _rate(m["first_token"].get(f"{suite}/{v}"))
                if note:
                    notes[note] = notes.get(note, 0) + 1
                cells.append(_cell(text, markup=True))  # numbers the page formats
            lines.append(f"| `{m['model']}` | " + " | ".join(cells) + " |")
    if notes:
        lines += ["", "‡ Zero-width intervals, and why: "
                  + "; ".join(f"{plain(n)} ({k} cells)" for n, k in notes.items()) + "."]
    lines += ["", f"Data: [atlas.json](../assets/results/{atlas.name}/atlas.json).", ""]
    return "\n".join(lines)


def step_rows(atlas: CommittedAtlas, step: str) -> list[tuple[Mapping[str, Any], Any]]:
    """The model rows of the atlas that hold a result of ``step`` (row, folder)."""
    out = []
    for row in atlas.data["models"]:
        folder = atlas.step(row, step)
        if folder is not None:
            out.append((row, folder))
    return out


def absent_rows(atlas: CommittedAtlas, step: str) -> list[tuple[str, str]]:
    """The models of the atlas without a result of ``step``, each with the reason (what the
    step recorded, or what its claim's cell says)."""
    claims = [c for c, st in CLAIM_STEP.items() if st == step]
    out = []
    for row in atlas.data["models"]:
        if atlas.step(row, step) is not None:
            continue
        marker = atlas.root / row["folder"] / step / STEP_MARKER
        reason = None
        if marker.is_file():
            reason = json.loads(marker.read_text(encoding="utf-8")).get("not_applicable")
        if reason is None and claims:
            reason = row["cells"][claims[0]].get("evidence")
        out.append((row["model"], str(reason or "not run")))
    return out
