"""Build the documentation site: run the experiments the pages show (cached), render the pages,
then ``mkdocs build``.

``make docs`` runs ``python -m docs.build`` from the repository root. A repository tool, not
part of the installed package; one module per job (plan, cache, runners, notebooks, tables,
pages, site). Steps:

1. **Experiments**, each cached in a folder named after a hash of its settings (under
   ``docs/_cache`` by default; a finished folder is reused, an unfinished one is redone): the sink
   census of every gallery model, the gallery's attention patterns, the experiments of
   :mod:`mechsink.experiments` (``structural_origin``, ``p0_sink``) on the main model, the
   code snippets the tutorials show (executed exactly as shown) and the notebooks (executed
   with nbclient on the main model).
2. **Pages**: every Markdown file under ``docs/`` is a Jinja template (numbers come from the
   JSON results, never typed in), copied into a staging folder with the figures (drawn from the
   JSON by :mod:`mechsink.viz`), a gallery page per model, a page per executed notebook, and
   a page per finding with a cross-model page (:mod:`docs.build.findings`).
3. **Site**: ``mkdocs build`` (Material theme, web fonts off, circuitsvis's JavaScript served
   from the site itself: nothing loads from the internet) into ``docs/_site``.

0. **Committed results** (:mod:`docs.build.results`): real-model runs kept as JSON under
   ``docs/results`` (the atlas) feed the home page, the finding pages they cover and the
   cross-model page (:mod:`docs.build.atlas_pages`); no model runs for them. A committed result
   of other settings than the plan's is refused; ``--rerun atlas`` redoes it.

The other pages are built on tiny models (``make docs``; ``--quick`` and
``MECHSINK_DOCS_QUICK=1`` say the same) and carry a banner saying so; ``--full`` builds them on
the real models (hours).

The build runs offline (:mod:`docs.build.offline`: ``--fetch`` fetches the registry files it
reads, beforehand), reuses ``report/census.json`` when it is the census it would compute
(:func:`docs.build.runners.reusable_census`), redoes cached results on ``--rerun KIND``, and
``python -m docs.build.check`` counts what would break from ``file://``.
"""

from __future__ import annotations

from docs.build.cache import Cache, Models, slug
from docs.build.notebooks import execute_notebook, notebook_markdown, set_parameters
from docs.build.pages import Site, render_pages
from docs.build.plan import CIRCUITS, DOCS, FULL, NOTEBOOKS, QUICK, ROOT, SNIPPETS, Plan
from docs.build.site import build, collect
from docs.build.tables import (
    escape_cell_pipes,
    fmt,
    norm_ratio_table,
    path_table,
    run_of,
    settings_line,
    sink_rate_table,
    summary_body,
    variance_table,
)

__all__ = [
    "CIRCUITS", "DOCS", "FULL", "NOTEBOOKS", "QUICK", "ROOT", "SNIPPETS", "Cache", "Models",
    "Plan", "Site", "build", "collect", "escape_cell_pipes", "execute_notebook", "fmt",
    "norm_ratio_table", "notebook_markdown", "path_table", "render_pages", "run_of",
    "set_parameters", "settings_line", "sink_rate_table", "slug", "summary_body",
    "variance_table",
]
