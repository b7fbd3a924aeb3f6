"""``dpl print``: parse and check a module (or import a model) and print it in canonical form."""

from __future__ import annotations

from dpl.cli.common import load_module, write_module


def add_print_command(sub) -> None:
    p = sub.add_parser("print", help="parse and check a module file (or import a model), print it in canonical form")
    p.add_argument("file", help="a module in the text form, an .onnx model, or - for stdin")
    p.add_argument("-o", "--output", metavar="FILE", help="write FILE (and FILE.npz, the constants too large to print) "
                                                          "instead of stdout; dpl run FILE reads both")
    p.set_defaults(func=cmd_print)


def cmd_print(args) -> int:
    write_module(load_module(args.file), args.output)
    return 0
