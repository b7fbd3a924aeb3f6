"""The old name of :mod:`dpl.backends.cuda.backend`, kept for plugins and scripts written against it."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("dpl.backends.cuda.backend")
