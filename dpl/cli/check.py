"""``dpl check``: validate pattern files and list their rules."""

from __future__ import annotations

import logging

from dpl.cli.common import check_names, print_json

log = logging.getLogger("dpl")


def add_check_command(sub) -> None:
    p = sub.add_parser("check", help="validate .dpl pattern files (or shipped library names) and list their rules",
                       epilog="The reference of the .dpl language, every construct with an example, is "
                              "docs/language.md in dpl's source tree.")
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
        _warn_of_unowned_prefixes(rules)
        return 0
    report = check_report(args.files)
    print(report)
    _warn_if_no_rules(args.files, int(report.splitlines()[-1].split()[0]))  # its last line: "N rules ok"
    from dpl.lang import _load

    _warn_of_unowned_prefixes(_load(args.files)[0])
    return 0


def _warn_of_unowned_prefixes(rules) -> None:
    """A codegen prefix no registered backend owns is valid (its backend may be registered at
    run time), but its matches would run on the NumPy reference: said here, before a build."""
    from dpl.backends import backends

    owned = {prefix for backend in backends().values() for prefix in getattr(backend, "prefixes", ())}
    unowned: dict[str, list[str]] = {}
    for r in rules:
        if r.kind == "pattern" and r.codegen and r.codegen not in owned:
            unowned.setdefault(r.codegen, []).append(r.name)
    for prefix, names in unowned.items():
        log.warning("codegen '%s' (%s): no registered backend owns this prefix; its matches run on the NumPy "
                    "reference, with a fall-back warning, unless a backend registers it (docs/writing-a-backend.md)",
                    prefix, ", ".join(names))


def _warn_if_no_rules(files: list[str], count: int) -> None:
    """A file with no rule is valid (one of ``def`` macros only, imported by others), so this
    is a warning, not an error; but "0 rules ok" alone reads as if the file had been checked."""
    if count == 0:
        names = ", ".join("<stdin>" if f == "-" else f for f in files)
        log.warning("%s define%s no rules: no pattern or rewrite to check", names, "s" if len(files) == 1 else "")
