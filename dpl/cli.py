"""The ``dpl`` command.

Exit codes: 0 ok, 1 bad input (a diagnostic on stderr), 2 usage (argparse), 3 an internal
failure (one line asking for a bug report; ``-v`` adds the traceback), 130 interrupted.
``-v`` / ``-q`` set the level of the ``dpl`` logger, which says what a command did beside its
output (``wrote m.ir``); the library itself never prints.

Each subcommand is added by an ``add_<name>_command(subparsers)`` function, listed once in
:func:`build_parser`; subcommands live in their own modules (``dpl/cli_<name>.py``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from dpl.cli_cache import add_cache_command
from dpl.cli_common import add_patterns_option, check_names, load_module, print_json, random_inputs, write_module
from dpl.cli_fmt import add_fmt_command
from dpl.cli_profile import add_profile_command
from dpl.cli_run import add_run_command
from dpl.cli_viz import add_demo_command, add_explain_command, add_report_command, add_viz_command
from dpl.errors import DplError

__all__ = ["build_parser", "main", "random_inputs"]

log = logging.getLogger("dpl")

EXIT_OK, EXIT_BAD_INPUT, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def add_print_command(sub) -> None:
    p = sub.add_parser("print", help="parse and check a module file (or import a model), print it in canonical form")
    p.add_argument("file", help="a module in the text form, an .onnx model, or - for stdin")
    p.add_argument("-o", "--output", metavar="FILE", help="write FILE (and FILE.npz, the constants too large to print) "
                                                          "instead of stdout; dpl run FILE reads both")
    p.set_defaults(func=cmd_print)


def cmd_print(args) -> int:
    write_module(load_module(args.file), args.output)
    return 0


def add_check_command(sub) -> None:
    p = sub.add_parser("check", help="validate .dpl pattern files (or shipped library names) and list their rules")
    p.add_argument("files", nargs="+", help=".dpl files, shipped library names, or - for stdin")
    p.add_argument("--json", action="store_true", help="print the rules as JSON (keys: rules, count; each rule: kind, name, "
                                                      "root_op, ops, variants, codegen, doc, location)")
    p.set_defaults(func=cmd_check)


def cmd_check(args) -> int:
    from dpl.lang.tool import check_report

    check_names(args.files)

    if args.json:
        from dpl.lang import _load

        rules, shadowed = _load(args.files)
        print_json({"rules": [{"kind": r.kind, "name": r.name, "root_op": r.root_op, "ops": list(r.ops), "variants": r.variants,
                               "codegen": r.codegen, "doc": r.doc, "location": str(r.span)} for r in rules],
                    "count": len(rules),
                    "shadowed": [{"name": d.name, "location": str(d.span), "earlier": str(k.span)} for d, k in shadowed]})
        _warn_if_no_rules(args.files, len(rules))
        return 0
    report = check_report(args.files)
    print(report)
    _warn_if_no_rules(args.files, int(report.splitlines()[-1].split()[0]))  # its last line: "N rules ok"
    return 0


def _warn_if_no_rules(files: list[str], count: int) -> None:
    """A file with no rule is valid (one of ``def`` macros only, imported by others), so this
    is a warning, not an error; but "0 rules ok" alone reads as if the file had been checked."""
    if count == 0:
        names = ", ".join("<stdin>" if f == "-" else f for f in files)
        log.warning("%s define%s no rules: no pattern or rewrite to check", names, "s" if len(files) == 1 else "")


def add_fuse_command(sub) -> None:
    p = sub.add_parser("fuse", help="rewrite and fuse a module file or model with pattern files or libraries; print the result")
    p.add_argument("file", help="a module in the text form, an .onnx model, or - for stdin")
    p.add_argument("-o", "--output", metavar="FILE", help="write the fused module to FILE (and FILE.npz) instead of stdout")
    add_patterns_option(p)
    p.add_argument("--report", action="store_true", help="also print which matches were accepted or rejected, and why")
    p.add_argument("--json", action="store_true", help="print JSON (keys: module, output, events; each event: pattern, "
                                                      "function, root, members, accepted, reason)")
    p.add_argument("--no-codegen", action="store_true", help="leave composites unwrapped (no Codegen functions)")
    p.add_argument("--no-auto", action="store_true", help="skip automatic fusion of what no pattern claimed")
    p.add_argument("--fuse-reductions", action="store_true",
                   help="beyond TVM: also fuse row-wise chains (decomposed softmax, RMSNorm, LayerNorm) into one kernel")
    p.set_defaults(func=cmd_fuse)


def cmd_fuse(args) -> int:
    import attrs

    from dpl.apply import apply
    from dpl.trace import Trace

    mod = load_module(args.file)
    trace = Trace()
    fused = apply(mod, args.patterns or (), annotate_codegen=not args.no_codegen, fuse=not args.no_auto,
                  fuse_reductions=args.fuse_reductions, trace=trace)
    to_file = args.output not in (None, "-")
    if to_file:
        write_module(fused, args.output)
    if args.json:
        print_json({"module": None if to_file else fused.script(), "output": args.output if to_file else None,
                    "events": [attrs.asdict(e) for e in trace.events]})
        return 0
    if not to_file:
        write_module(fused, None)
    if args.report:
        report = trace.report()
        print(report if to_file else "\n# report\n" + "\n".join(f"# {line}" for line in report.splitlines()))
    return 0


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
    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else record.levelname.lower() + ": "
        text = f"dpl: {level}{record.getMessage()}"
        return text + "\n" + self.formatException(record.exc_info) if record.exc_info else text


def _configure_logging(verbose: int, quiet: int) -> logging.Handler:
    """The ``dpl`` logger on stderr at INFO, DEBUG with -v, ERROR with -q."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    log.addHandler(handler)
    log.setLevel(logging.ERROR if quiet > verbose else logging.DEBUG if verbose > quiet else logging.INFO)
    return handler


def _log_warning(message, category, filename, lineno, file=None, line=None) -> None:
    log.warning("%s", message)


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
