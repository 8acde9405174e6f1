"""Moved to :mod:`mechsink.measure.seedprint`: structure at random initialisation is measured,
not trained. This name stays for old imports and is the same module."""

import sys

from mechsink.measure import seedprint as _moved

sys.modules[__name__] = _moved
