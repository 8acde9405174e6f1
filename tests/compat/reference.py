"""Write the compatibility suite's reference numbers: every entry point on the bridge of each
tiny family, in this environment (``make test`` runs it in the main environment, then the suite
in each TransformerLens environment compares against the file).

Usage, from the repository root: ``python -m tests.compat.reference OUT.pt``
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from . import _compat

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(out: str) -> None:
    from mechsink.io import atomic_file

    data = {"transformer_lens": _compat.transformer_lens_version(),
            "families": {f: _compat.compute(_compat.bridge(f)) for f in _compat.FAMILIES}}
    failed = [(f, k, v) for f, res in data["families"].items() for k, v in res.items()
              if isinstance(v, str)]
    if failed:
        raise SystemExit(f"the reference bridge failed: {failed}")
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(Path(out)) as (_tmp, fh):
        torch.save(data, fh)
    print(f"reference numbers (bridge, TransformerLens {data['transformer_lens']}) -> {out}")


if __name__ == "__main__":
    main(sys.argv[1])
