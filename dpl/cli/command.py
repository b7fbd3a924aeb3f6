"""The ``dpl`` command.

Exit codes: 0 ok, 1 bad input (a diagnostic on stderr), 2 usage (argparse), 3 an internal
failure (one line asking for a bug report; ``-v`` adds the traceback), 130 interrupted.
``-v`` / ``-q`` set the level of the ``dpl`` logger, which says what a command did beside its
output (``wrote m.ir``); the library itself never prints.

Each subcommand is added by an ``add_<name>_command(subparsers)`` function, listed once in
:func:`build_parser`; each subcommand lives in its own module of this package
(``dpl/cli/<name>.py``), their shared helpers in ``dpl/cli/common.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from pathlib import Path

from dpl.cli.cache import add_cache_command
from dpl.cli.check import add_check_command
from dpl.cli.common import check_names
from dpl.cli.demo import add_demo_command
from dpl.cli.explain import add_explain_command
from dpl.cli.fmt import add_fmt_command
from dpl.cli.fuse import add_fuse_command
from dpl.cli.ops import add_ops_command
from dpl.cli.print_module import add_print_command
from dpl.cli.profile import add_profile_command
from dpl.cli.report import add_report_command
from dpl.cli.run import add_run_command
from dpl.cli.viz import add_viz_command
from dpl.errors import DplError

__all__ = ["build_parser", "main"]

log = logging.getLogger("dpl")

EXIT_OK, EXIT_BAD_INPUT, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def build_parser() -> argparse.ArgumentParser:
    """The ``dpl`` parser: one ``add_<name>_command(subparsers)`` call per subcommand."""
    from dpl import __version__

    parser = argparse.ArgumentParser(prog="dpl", description="rewrite and fuse tensor-program graphs",
                                     epilog="'dpl COMMAND --help' describes a command. Exit codes: 0 ok, 1 bad input, "
                                            "2 usage, 3 internal failure (a bug), 130 interrupted.")
    parser.add_argument("--version", action="version", version=f"dpl {__version__}")
    _add_verbosity(parser, default=0)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add_command in (
        add_print_command,
        add_run_command,
        add_check_command,
        add_fuse_command,
        add_profile_command,
        add_demo_command,
        add_report_command,
        add_viz_command,
        add_explain_command,
        add_fmt_command,
        add_cache_command,
        add_ops_command,
    ):
        add_command(sub)
    for command in sub.choices.values():  # -v / -q after the subcommand too
        _add_verbosity(command, default=argparse.SUPPRESS)
    return parser


def _add_verbosity(parser: argparse.ArgumentParser, default) -> None:
    if "-v" in parser._option_string_actions or "-q" in parser._option_string_actions:
        return  # a subcommand that means something else by them
    parser.add_argument("-v", "--verbose", action="count", default=default, help="say more (-vv: debug)")
    parser.add_argument("-q", "--quiet", action="count", default=default, help="say only errors")


class _Formatter(logging.Formatter):
    """``dpl: what it did`` (INFO), ``dpl:   more detail`` (DEBUG, asked for with -v: indented
    under the lines it details, not labelled like a debug dump), ``dpl: warning: ...`` and
    ``dpl: error: ...``. Messages carry no ``dpl:`` of their own: this adds it."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno >= logging.ERROR:
            level = "error: "
        elif record.levelno >= logging.WARNING:
            level = "warning: "
        elif record.levelno >= logging.INFO:
            level = ""
        else:
            level = "  "
        text = f"dpl: {level}{record.getMessage()}"
        return text + "\n" + self.formatException(record.exc_info) if record.exc_info else text


class _Handler(logging.StreamHandler):
    """A log line goes above a progress line drawn on the same stream, never into it."""

    def emit(self, record: logging.LogRecord) -> None:
        from dpl.runtime.progress import above_progress

        with above_progress(self.stream):
            super().emit(record)


def _configure_logging(verbose: int, quiet: int) -> logging.Handler:
    """The ``dpl`` logger on stderr at INFO, DEBUG with -v, ERROR with -q."""
    handler = _Handler(sys.stderr)
    handler.setFormatter(_Formatter())
    log.addHandler(handler)
    log.setLevel(logging.ERROR if quiet > verbose else logging.DEBUG if verbose > quiet else logging.INFO)
    return handler


def _log_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message)
    if text.startswith("dpl: ") or _is_dpls(filename):  # dpl's own (a "dpl:" said for programs without this logger)
        log.warning("%s", text.removeprefix("dpl: "))
    else:  # another library's (NumPy's overflow inside a plugin's kernel): said as whose and where
        log.warning("%s from %s:%d: %s", category.__name__, "/".join(Path(filename).parts[-2:]), lineno, text)


def _is_dpls(filename: str) -> bool:
    import dpl.backends

    here = Path(filename).resolve()
    return any(here.is_relative_to(Path(root).resolve()) for root in [*dpl.__path__, *dpl.backends.__path__])


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # Ctrl-C: the shell's code for SIGINT, no traceback
        return EXIT_INTERRUPTED


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version, or a usage error (argparse printed it)
        return stop.code if isinstance(stop.code, int) else EXIT_OK
    handler = _configure_logging(getattr(args, "verbose", 0), getattr(args, "quiet", 0))
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _log_warning
            # a misspelt -p library or --target fails before any work, with a did-you-mean
            check_names(getattr(args, "patterns", ()), getattr(args, "target", None))
            return args.func(args)
    except DplError as err:
        print(err, file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # stdout closed early (dpl print ... | head): not an error
        _silence_stdout()
        return EXIT_OK
    except Exception as err:  # a bug in dpl, not in the user's input
        log.debug("where the internal error happened:", exc_info=True)
        print(f"dpl: internal error ({type(err).__name__}: {err}); please report it as a bug (-v shows the traceback)",
              file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        log.removeHandler(handler)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    sys.exit(main())
