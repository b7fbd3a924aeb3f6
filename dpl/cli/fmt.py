"""``dpl fmt FILE...``: print ``.dpl`` pattern files in their canonical layout (comments kept).

    dpl fmt my.dpl            the formatted text on standard output
    dpl fmt -i a.dpl b.dpl    rewrite the files in place (only those that change; through symlinks)
    dpl fmt --check *.dpl     change nothing; list the files that would change, exit 1 if any
    dpl fmt - < my.dpl        standard input to standard output

A file with a syntax error is reported as ``dpl check`` would and left alone; the others are
still formatted, and the exit status is 1.
"""

from __future__ import annotations

import os
import sys
import tempfile

from dpl.errors import DplError


def _read(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        raise DplError(f"'{path}' does not exist") from None
    except IsADirectoryError:
        raise DplError(f"'{path}' is a directory, not a pattern file") from None
    except UnicodeDecodeError:
        raise DplError(f"'{path}' is not a UTF-8 text file") from None
    except OSError as err:
        raise DplError(f"cannot read '{path}': {err.strerror}") from None


def _write(path: str, text: str) -> None:
    """Replace ``path`` atomically (a reader never sees half a file), keeping its mode. A
    symlink stays a link: the file it points to is the one rewritten."""
    target = os.path.realpath(path)
    folder = os.path.dirname(target)
    mode = os.stat(target).st_mode & 0o7777
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".dpl-fmt-", suffix=".tmp")
    except OSError as err:
        raise DplError(f"cannot write '{path}': {err.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except OSError as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise DplError(f"cannot write '{path}': {err.strerror}") from None


def cmd_fmt(args) -> int:
    from dpl.lang.format import format_text

    if args.write and "-" in args.files:
        raise DplError("-i/--write rewrites files; standard input ('-') has no file to rewrite")
    status = 0
    for path in args.files:
        name = "<stdin>" if path == "-" else path
        try:
            text = _read(path)
            out = format_text(text, name)
        except DplError as err:
            print(err, file=sys.stderr)
            status = 1
            continue
        if args.check:
            if out != text:
                print(name)
                status = 1
        elif args.write:
            if out != text:
                _write(path, out)
        else:
            sys.stdout.write(out)
    return status


def add_fmt_command(sub) -> None:
    p = sub.add_parser("fmt", help="print .dpl pattern files in canonical layout, comments kept (-i rewrites them, --check for CI)")
    p.add_argument("files", nargs="+", metavar="FILE", help="a .dpl file, or - for standard input")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("-i", "--write", action="store_true", help="rewrite the files in place (only those that change)")
    mode.add_argument("--check", action="store_true",
                      help="change nothing: list the files that are not formatted and exit 1 if there are any")
    p.set_defaults(func=cmd_fmt)
