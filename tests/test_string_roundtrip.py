"""Strings escape and unescape as written, in both text forms: any Python string printed by the
IR printer (dpl.syntax.escape_string) reads back equal, through the IR parser and through the
.dpl parser, with UTF-8 text kept as is and stable over repeated round trips."""

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

import dpl
from dpl.lang.parser import parse_file
from dpl.syntax import escape_string

BASE = dpl.parse("func main(x: f32[4]) -> f32[4] {\n  y = exp(x)\n  return y\n}\n")


def with_attrs(**values) -> dpl.Module:
    fn = attrs.evolve(BASE.functions["main"], attrs=values)
    return dpl.Module([fn])


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_ir_strings_round_trip(value):
    text = with_attrs(Composite=value, note=value).script()
    assert text.count("\n") == BASE.script().count("\n") + 2  # two decorator lines: no raw newline inside a string
    mod = dpl.parse(text)
    assert dict(mod.functions["main"].attrs) == {"Composite": value, "note": value}
    assert mod.script() == text  # and stable: printing what was read gives the same text


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_dpl_strings_read_as_the_printer_writes(value):
    tree = parse_file(f"codegen t\npattern p {{\n  y = exp(x)\n  where attr(y, {escape_string(value)}) == 1\n}}\n")
    assert tree.decls[1].body.wheres[0].left.args[1].value == value


def test_known_cases():
    assert escape_string("a\nb") == '"a\\nb"'
    assert escape_string("caf\u00e9") == '"caf\u00e9"'  # UTF-8 kept, not escaped, not mangled
    assert escape_string('q"\\\t\r\x00\u2028') == '"q\\"\\\\\\t\\r\\u0000\\u2028"'
    text = with_attrs(Composite="caf\u00e9").script()
    for _ in range(3):
        text = dpl.parse(text).script()
    assert '@composite("caf\u00e9")' in text
