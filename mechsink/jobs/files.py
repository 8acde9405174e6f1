"""The merged files of a sweep job: their schema, JSON and CSV text."""

from __future__ import annotations

import csv
import io
from typing import Any

from mechsink.io import json_text as _json_text

MERGED_SCHEMA = "mechsink-sweep/1"


def json_text(data: Any) -> str:
    """Strict JSON, one space of indent, sorted keys (a merge depends on its inputs only)."""
    return _json_text(data, indent=1, sort_keys=True)


def csv_text(rows: list[dict[str, Any]], columns: list[str]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
