"""`python -m docs.build`: build the site from the committed results (docs/results) and tiny models
for the rest (`--full`: the rest on the real models, hours)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from docs.build.offline import fetch_assets, require_offline
from docs.build.plan import FULL, QUICK
from docs.build.results import RESULTS, RefusedError, import_atlas
from docs.build.site import build
from mechsink.errors import AssetError, MechsinkError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m docs.build",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="the pages without committed results on tiny models (the default; "
                             "MECHSINK_DOCS_QUICK=1 says the same)")
    parser.add_argument("--full", action="store_true",
                        help="the pages without committed results on the real models (hours)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the committed results (docs/results)")
    parser.add_argument("--no-results", action="store_true",
                        help="ignore the committed results (every page from the plan's models)")
    parser.add_argument("--import-results", nargs=2, metavar=("NAME", "FOLDER"),
                        help="copy the JSON of a finished run into the committed results, then "
                             "stop (NAME: atlas, FOLDER: its --out folder)")
    parser.add_argument("--commit", default=None,
                        help="with --import-results: the mechsink commit the run was made at "
                             "(default: the commit checked out here)")
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
                             "notebook-*; atlas: rerun the committed atlas on the real models "
                             "and import it, hours; repeatable)")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.fetch:
        fetch_assets()
        return
    if args.import_results:
        name, folder = args.import_results
        if name != "atlas":
            raise SystemExit(f"python -m docs.build: --import-results knows `atlas`, not "
                             f"{name!r}.")
        try:
            entry = import_atlas(folder, name=name, root=args.results, commit=args.commit)
        except MechsinkError as exc:
            raise SystemExit(f"python -m docs.build: {exc}") from None
        print(f"imported {len(entry['files'])} JSON files of {folder} into "
              f"{args.results / name} (made by `{entry['command']}` on {entry['made']}); "
              f"commit them with {args.results / 'manifest.json'}.")
        return
    if args.full and (args.quick or os.environ.get("MECHSINK_DOCS_QUICK", "") not in ("", "0")):
        raise SystemExit("python -m docs.build: --full and --quick (MECHSINK_DOCS_QUICK=1) "
                         "contradict each other: give one.")
    try:
        require_offline()
        out = build(FULL if args.full else QUICK, site_dir=args.site, cache_dir=args.cache,
                    work_dir=args.work, notebooks=not args.no_notebooks,
                    rerun=tuple(args.rerun), results=None if args.no_results else args.results)
    except (AssetError, RefusedError) as exc:  # one message, no traceback
        raise SystemExit(f"python -m docs.build: {exc}") from None
    print(out / "index.html")


if __name__ == "__main__":
    main()
