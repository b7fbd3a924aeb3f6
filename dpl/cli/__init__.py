"""The ``dpl`` command line: the parser and ``main`` in :mod:`dpl.cli.command`, one module per
subcommand, and their shared helpers (reading a module, random inputs, the -p option) in
:mod:`dpl.cli.common`."""

from dpl.cli.command import build_parser, main
from dpl.cli.common import random_inputs

__all__ = ["build_parser", "main", "random_inputs"]
