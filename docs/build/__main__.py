"""`python -m docs.build`: build the site (`--quick` or MECHSINK_DOCS_QUICK=1: tiny models)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from docs.build.offline import fetch_assets, require_offline
from docs.build.plan import FULL, QUICK
from docs.build.site import build
from mechsink.errors import AssetError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m docs.build",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        default=os.environ.get("MECHSINK_DOCS_QUICK", "") not in ("", "0"),
                        help="tiny models only (seconds; what the browser test builds)")
    parser.add_argument("--site", type=Path, default=None, help="output folder (docs/_site)")
    parser.add_argument("--cache", type=Path, default=None,
                        help="experiment cache (docs/_cache)")
    parser.add_argument("--work", type=Path, default=None, help="staging folder (docs/_build)")
    parser.add_argument("--no-notebooks", action="store_true",
                        help="skip executing and rendering the notebooks")
    parser.add_argument("--fetch", action="store_true",
                        help="fetch the registry files the build reads, then stop (the one "
                             "step that uses the network; `make setup` runs it)")
    parser.add_argument("--rerun", action="append", default=[], metavar="KIND",
                        help="redo cached results of this kind even if nothing changed "
                             "(scan, gallery, figures, circuit-p0_sink, circuit-*, snippet-*, "
                             "notebook-*; repeatable)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.fetch:
        fetch_assets()
        return
    try:
        require_offline()
    except AssetError as exc:  # before any work: one message, no traceback
        raise SystemExit(f"python -m docs.build: {exc}") from None
    out = build(QUICK if args.quick else FULL, site_dir=args.site, cache_dir=args.cache,
                work_dir=args.work, notebooks=not args.no_notebooks, rerun=tuple(args.rerun))
    print(out / "index.html")


if __name__ == "__main__":
    main()
