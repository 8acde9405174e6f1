"""Jobs: each unit of work mechsink runs from the command line or in a sweep, in one module.

A job module holds a frozen ``Spec`` (every option with its default, its help and the types
its sweep table takes; ``TABLE`` is the sweep's view of it), ``check(spec, models)`` (every
check that needs no weights, before any model loads), ``run(model, spec, ...)`` (one model's
result), ``run_shard(model, shard)`` (a sweep shard's JSON-able result; ``model()`` loads the
shard's model) and ``merge(table, done, missing, folder)`` (the sweep's merged result set);
optionally ``takes_model(table)`` (False: one shard without a model) and ``shard_parts(table,
pairs)`` (a model's work split over several shards). ``mechsink.app.cli`` maps its options to a
spec and ``mechsink.app.sweep`` its TOML tables, so a default or a check exists once; a new
sweep job is a module here and its name in :data:`JOBS`.

=============  ===============================================================================
``census``     the sink census (``mechsink scan``; sweep job ``census``)
``timeline``   the sink measurements of one training checkpoint (sweep job ``timeline``)
``patch``      activation patching over prompt pairs (``mechsink patch``; sweep job ``patch``)
``experiment`` an experiment of :mod:`mechsink.experiments` (``mechsink experiment``)
``atlas``      one model's column of the atlas (sweep job ``atlas``)
``discover``   edge-level circuit discovery (``mechsink discover``; sweep job ``discover``)
``train``      training an organism (``mechsink train``; not a sweep job: a resumable run
               folder of its own)
=============  ===============================================================================

Importing this package (as the command line does) imports no torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["JOBS", "job"]

#: the sweep's jobs, in the order a spec's tables are read
JOBS = ("census", "timeline", "patch", "experiment", "atlas", "discover")


def job(name: str) -> ModuleType:
    """The module of job ``name`` (one of :data:`JOBS`)."""
    if name not in JOBS:
        raise KeyError(name)
    return importlib.import_module(f"mechsink.jobs.{name}")
