"""ExperimentResult: an experiment's data (JSON-able, versioned) and what is drawn from it."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mechsink.io import atomic_write_json, atomic_write_text, result_set


def verdict_lines(verdicts: dict[str, dict[str, str]]) -> list[str]:
    """Markdown lines for verdicts written as ``{verdict, criterion, evidence}``: each verdict
    with the criterion it was judged by, then what was measured."""
    return ["Verdicts (criterion, then what was measured):", "",
            *[f"- **{claim}**: {v['verdict']}. Criterion: {v['criterion']}. Measured: "
              f"{v['evidence']}." for claim, v in verdicts.items()]]


@dataclass(frozen=True)
class ExperimentResult:
    """What ``mechsink.experiments.<name>.run`` returns.

    ``data`` holds every number (it is what ``result.json`` holds); :meth:`summary` (Markdown)
    and :meth:`figure` are drawn from it by the experiment's module, so a saved result can be
    re-rendered without a model: ``ExperimentResult.load(folder)``.
    """

    name: str
    data: dict[str, Any]

    def _module(self) -> Any:
        return importlib.import_module(f"mechsink.experiments.{self.name}")

    @property
    def result_file(self) -> str:
        return getattr(self._module(), "RESULT_FILE", "result.json")

    def summary(self) -> str:
        """The Markdown summary: settings, tables, verdicts with their criteria."""
        return self._module().summary(self.data)

    def figure(self, path: str | Path) -> Path | None:
        """Draw the experiment's figure into ``path`` (None if it has none)."""
        draw = getattr(self._module(), "figure", None)
        return None if draw is None else draw(self.data, Path(path))

    def save(self, out: str | Path) -> Path:
        """Write the result JSON (strict: a non-finite number is ``null`` with a reason), the
        figure and ``summary.md`` into ``out`` as one result set (:func:`mechsink.io.result_set`):
        the summary is drawn first, and a failure, a kill or a full disk leaves the previous
        result there whole."""
        out = Path(out)
        summary = self.summary()  # a summary that fails writes nothing
        name = getattr(self._module(), "FIGURE", None)
        with result_set(out) as staging:
            atomic_write_json(staging / self.result_file, {"experiment": self.name, **self.data})
            if name:
                self.figure(staging / name)
            atomic_write_text(staging / "summary.md", summary)
        return out

    @classmethod
    def load(cls, folder: str | Path, name: str) -> ExperimentResult:
        """Read a result saved by :meth:`save` for experiment ``name``."""
        module = importlib.import_module(f"mechsink.experiments.{name}")
        path = Path(folder) / getattr(module, "RESULT_FILE", "result.json")
        data = json.loads(path.read_text(encoding="utf-8"))
        data.pop("experiment", None)
        return cls(name, data)

    def judged(self) -> ExperimentResult:
        """This result with its verdicts judged again by the experiment's current criteria (the
        measurements unchanged): what a resumed run shows for a step it reads back."""
        judge = getattr(self._module(), "verdicts", None)
        if judge is None or "verdicts" not in self.data:
            return self
        return ExperimentResult(self.name, {**self.data, "verdicts": judge(self.data)})

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)

    def __repr__(self) -> str:
        schema = self.data.get("schema", "?")
        model = self.data.get("model")
        return f"ExperimentResult({self.name!r}, schema={schema!r}" + (
            f", model={model!r})" if model else ")")

    def _repr_markdown_(self) -> str:  # Jupyter shows the summary
        return self.summary()

    def _repr_html_(self) -> str | None:
        """The summary as HTML (with the ``markdown`` package; None lets Jupyter fall back
        to :meth:`_repr_markdown_`)."""
        try:
            import markdown
        except ImportError:
            return None
        return f"<div>{markdown.markdown(self.summary(), extensions=['tables'])}</div>"
