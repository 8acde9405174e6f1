"""The compatibility suite (a package, so that its modules import their shared code by a
relative import: ``pytest tests/compat`` and ``python -m tests.compat.reference``)."""
