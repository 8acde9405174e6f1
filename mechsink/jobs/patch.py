"""Activation patching as a job: ``mechsink patch`` (one prompt pair) and the sweep's
``patch`` table (a file of prompt pairs, sharded)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mechsink import settings
from mechsink.errors import BadInputError
from mechsink.jobs.spec import at, from_settings, parse_numbers, setting, sweep_name, sweep_table

SITE_HELP = ("resid_pre|resid_mid|resid_post|attn_out|mlp_out|z|q|k|v|pattern|neuron, or any "
             "hook name (attn.hook_z, blocks.3.attn.hook_z, L3H5@0, MLP3), optionally _by_pos "
             "/ _all_pos")
METRIC_HELP = ("logit_diff[:GOOD:BAD], log_prob:T, kl, sink_score:L[:H], "
               "massive_value:L:POS:CH, resid_norm:L:POS")


@dataclass(frozen=True)
class Spec:
    """What is patched, what is read and how; ``pairs`` (a JSON-lines file) and
    ``pairs_per_shard`` belong to the sweep, ``positions``, ``key_position`` and
    ``memory_budget`` to the command line."""

    pairs: str | None = setting(None, (str,), "JSON-lines file of clean/corrupted pairs",
                                required=True)
    site: str = setting("resid_pre", (str,), SITE_HELP)
    metric: str = setting("logit_diff", (str,), METRIC_HELP)
    layers: Sequence[Any] | None = setting(None, (list,), "layers (default: all)")
    positions: Sequence[Any] | None = setting(None, (list,), "positions to patch (default: "
                                                "all)", sweep=False)
    key_position: int | None = setting(None, (int,), "a sink_score metric's key position "
                                       "(default 0: the first token's sink)", sweep=False)
    direction: str = setting("denoise", (str,), "denoise (patch clean into corrupted) or noise")
    normalize: bool = setting(False, (bool,), "rescale so 0 = run input, 1 = source input")
    prepend_bos: bool = setting(True, (bool,), "put the tokenizer's BOS token at position 0")
    memory_budget: str | None = setting(None, (str,), "bytes of activations to plan for, e.g. "
                                        "2GiB or 512MiB (default: a share of the device's free "
                                        "memory)", sweep=False)
    pairs_per_shard: int = setting(8, (int,), "prompt pairs per shard")


TABLE = sweep_table(Spec)


def check(spec: Spec, models: Sequence[str] = (), pairs: Sequence[Sequence[str]] = (),
          option: Callable[[str], str] = sweep_name) -> None:
    """The site, metric, direction and prompt pairs, and with the zoo names ``models`` the
    layers, the metric and the pairs' lengths against each one's config and tokenizer (no
    weights load): what every shard of that model would otherwise find out at run time."""
    at("layers", settings.check_layers, spec.layers)
    at("site", settings.check_site, spec.site, spec.layers)
    metric = at("metric", settings.read_metric, spec.metric)  # parsed once, here
    at("direction", settings.check_direction, spec.direction, option("direction"))
    at("pairs", settings.check_pairs, pairs)
    for model in models:
        at("layers", settings.check_layers, spec.layers, model)
        at("metric", settings.check_metric, metric, model)
        at("pairs", settings.check_pair_lengths, model, pairs,
           f"prompt-pair file {spec.pairs}")


@dataclass(frozen=True)
class Command:
    """``mechsink patch``'s one prompt pair, checked: the spec (its layers and positions
    parsed), the site it patches, the metric (parsed once, here) and the memory budget in
    bytes (None: the device's share)."""

    spec: Spec
    clean: str
    corrupted: str
    site: Any  # a mechsink.patching site
    memory_budget: int | None
    metric: Any  # a mechsink.patching Metric, checked against the model when patching binds it


def check_command(spec: Spec, model: str, clean: str, corrupted: str, *,
                  layers: str | None = None, positions: str | None = None) -> Command:
    """Every check of ``mechsink patch`` that needs no weights, before any model loads: the
    command line's ``layers`` / ``positions`` (comma-separated) and the site, the prompts (UTF-8,
    not empty, of one token count with the zoo name ``model``'s tokenizer where it comes
    without the weights), the metric and its key position, the direction, the memory budget,
    and the name ``model`` itself. Errors name the command line's options."""
    from mechsink.jobs.discover import check_no_empty_prompt
    from mechsink.jobs.prompts import check_same_lengths
    from mechsink.model.memory import parse_size
    from mechsink.patching import parse_site

    chosen = parse_numbers(layers, "--layers")
    where = parse_numbers(positions, "--positions", "position")
    site = parse_site(spec.site, layers=chosen, **({} if where is None else {"positions": where}))
    settings.check_text(clean, "--clean")
    settings.check_text(corrupted, "--corrupted")
    check_no_empty_prompt([clean], [corrupted])
    metric = settings.read_metric(spec.metric)  # parsed once, here
    check_key_position(metric, spec.key_position, spec.metric)
    settings.check_direction(spec.direction)
    budget = None if spec.memory_budget is None else parse_size(spec.memory_budget)
    settings.check_context(model, 1, "--clean")  # the name, before the model loads
    tok = settings.model_tokenizer(model)  # no weights needed
    if tok is not None:
        check_same_lengths(tok, {"--clean": [clean], "--corrupted": [corrupted]}, early=True)
    return Command(replace(spec, layers=chosen, positions=where), clean, corrupted, site, budget,
                   metric)


def check_key_position(metric: Any, key_position: int | None, given: str) -> None:
    """``--key-position`` belongs to a sink_score metric (``metric``, parsed from the string
    ``given``) and is a position (checked before any model loads; against the prompt's
    length once it is tokenised)."""
    from mechsink.patching import SinkScore

    if key_position is None:
        return
    if not isinstance(metric, SinkScore):
        raise BadInputError(f"--key-position is the key position of a sink_score metric; "
                            f"--metric {given!r} has none.")
    if key_position < 0:
        raise BadInputError(f"--key-position: position numbers start at 0, got {key_position}.")


def at_key(metric: Any, key_position: int | None, seq_len: int) -> Any:
    """``metric`` reading the sink at ``key_position`` (unchanged without one)."""
    if key_position is None:
        return metric
    if key_position >= seq_len:
        raise BadInputError(f"--key-position {key_position} is past the prompt's {seq_len} "
                            f"tokens (positions 0..{seq_len - 1}).")
    return replace(metric, position=key_position)


def run(model: Any, spec: Spec, pairs: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """Each prompt pair patched at the site (its result as JSON-able data), in order."""
    from mechsink.model import to_tokens
    from mechsink.patching import activation_patch, parse_metric, parse_site

    site = parse_site(spec.site, layers=None if spec.layers is None else tuple(spec.layers))
    metric = parse_metric(spec.metric)  # once: a bare logit_diff reads each pair's runs
    results = []
    for clean, corrupted in pairs:
        c = to_tokens(model, clean, prepend_bos=spec.prepend_bos)
        x = to_tokens(model, corrupted, prepend_bos=spec.prepend_bos)
        r = activation_patch(model, c, x, site, metric, direction=spec.direction,
                             normalize=spec.normalize, prepend_bos=spec.prepend_bos)
        results.append(r.to_dict())
    return results



def shard_parts(table: dict[str, Any], pairs: Sequence[Sequence[str]]
                ) -> list[tuple[str, dict[str, Any]]]:
    """A model's shards: ``pairs_per_shard`` prompt pairs each (the id's suffix, the
    settings with the pairs' first index and the pairs)."""
    size = table["pairs_per_shard"]
    return [(f"-pairs{i:05d}", dict(table, first=i, pair_list=[list(p) for p in
                                                                pairs[i:i + size]]))
            for i in range(0, len(pairs), size)]

def run_shard(model: Callable[[], Any], shard: dict[str, Any]) -> dict[str, Any]:
    """A sweep shard: the shard's slice of prompt pairs on its model (``model()`` loads it)."""
    s = shard["settings"]
    return {"first": s["first"], "pairs": run(model(), from_settings(Spec, s), s["pair_list"])}


def merge(table: dict[str, Any], done: list, missing: list[str], folder: Path) -> list[Path]:
    """Every model's pairs in order, and their mean values where the shapes agree."""
    import json

    import torch

    from mechsink.io import atomic_write_text
    from mechsink.jobs.files import MERGED_SCHEMA, json_text

    per_model: dict[str, list[dict[str, Any]]] = {}
    for s, r in done:
        pairs = per_model.setdefault(s["model"]["label"], [])
        for k, result in enumerate(r["pairs"]):
            clean, corrupted = s["settings"]["pair_list"][k]
            pairs.append({"index": r["first"] + k, "clean": clean, "corrupted": corrupted,
                          "result": result})
    models = []
    for label, pairs in per_model.items():
        pairs.sort(key=lambda p: p["index"])
        shapes = {json.dumps(torch.tensor(p["result"]["values"]).shape) for p in pairs}
        mean = None
        if len(shapes) == 1:
            mean = torch.tensor([p["result"]["values"] for p in pairs],
                                dtype=torch.float64).mean(0).tolist()
        models.append({"model": label, "n_pairs": len(pairs), "mean_values": mean,
                       "pairs": pairs})
    data = {"schema": MERGED_SCHEMA, "job": "patch", "settings": dict(table),
            "missing": missing, "models": models}
    return [atomic_write_text(folder / "patch.json", json_text(data))]
