"""Hostile-but-fair input, fuzzed: the .ir and .dpl texts of examples/ and patterns/ with pieces
spliced in that broke dpl before (deep nesting, long `|` chains, huge or out-of-range numbers,
bad escapes, negative or zero dims, recursion, hostile imports). Every text either works or
ends in a DplError that points at the file; never another exception, never a hang.

The budget is fixed (a few hundred examples, no deadline per example) so CI stays fast; run
``python tests/test_hostile_fuzz.py N`` for a longer campaign of N examples per fuzzer.
"""

import re
import sys
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpl
from dpl.errors import DplError
from test_text_roundtrip import every_op_module

ROOT = Path(__file__).parent.parent
DPL_TEXTS = [p.read_text() for p in sorted((ROOT / "patterns").glob("*.dpl"))]
IR_TEXTS = [p.read_text() for p in sorted((ROOT / "examples").glob("*.ir"))]
EXAMPLES = 300


# how deep to nest: around the limits, and far past them (hypothesis would favour small ints)
DEPTHS = st.sampled_from([1, 2, 10, 60, 64, 65, 99, 100, 101, 300, 1000])


def _nest(open_: str, inner: str, close: str):
    return DEPTHS.map(lambda n: open_ * n + inner + close * n)


SHARED = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "-3", "0", "1e20", "1e400", "9223372036854775808", "-9223372036854775809",
                     "300:i8", "1e6:f16", "2:bool", "-1:u8", '"\\x"', '"\\u12"', '"caf\u00e9"', '"a\\nb"', '"\\', "\\",
                     "[-3]", "[0]", "[]", "(", ")", "[", "]", ",", "=", ":", "\n", " "]),
    st.sampled_from([19, 20, 21, 4301]).map(lambda n: "9" * n),
    DEPTHS.map(lambda n: "x" + " | x" * n),
    _nest("(", "x", ",)"),
    _nest("[", "", "]"),
)
IR_PIECES = st.one_of(
    SHARED,
    st.sampled_from(["main(x)", "f32[100000, 100000, 100000]", "f32[0]", "f32[-1]", "i8[", "((f32[4],),)", "x[0]",
                     "ones(shape=[-3])", "arange(end=nan)", "max(x, axis=[0])", "triu(x, k=1e20)", "@composite(",
                     "func", "return", "const"]),
    _nest("exp(", "x", ")"),
    _nest("(", "x", ")"),
)
DPL_PIECES = st.one_of(
    SHARED,
    st.sampled_from(['import "/dev/zero"\n', 'import "/etc/passwd"\n', 'import "../../x.dpl"\n', "where [1] * 99999999999 == [1]",
                     "where rank(x) + 1 == 2", "_", "...", "const", "~", "|", "&", "?", "=>", "priority 99999999999999999999",
                     "def f(x) = f(x)\n", "def g(y) = exp(y) | exp(y)\n", "g(", "equiv power(x, 2.0) == multiply(x, x)\n",
                     "power(", ", 2.0)"]),
    DEPTHS.map(lambda n: "~" * n),
    _nest("exp(", "x", ")"),
    _nest("(", "1", " + 1)"),
    DEPTHS.map(lambda n: "rank(x)" + " + 1" * n),
)


# ways to wrap an operand so that the text stays well-formed: nesting and chains of it
IR_WRAPS = [("exp(", ")"), ("(", ",)"), ("negative(", ")")]
DPL_WRAPS = [("exp(", ")"), ("(", ",)"), ("~", ""), ("(", ")"), ("", " | _"), ("", " & _")]
OPERAND = re.compile(r"(?<=[(, ])[A-Za-z_]\w*(?=[,)])")


def splice(text: str, pieces, data, wraps) -> str:
    """1 to 3 mutations: an operand wrapped many times over, or a hostile piece spliced in anywhere."""
    for _ in range(data.draw(st.integers(1, 3))):
        operands = list(OPERAND.finditer(text))
        if operands and data.draw(st.booleans()):
            m = data.draw(st.sampled_from(operands))
            (open_, close), n = data.draw(st.sampled_from(wraps)), data.draw(DEPTHS)
            text = text[:m.start()] + open_ * n + m.group() + close * n + text[m.end():]
            continue
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 8)))
        text = text[:i] + data.draw(pieces) + text[j:]
    return text


def located(err: DplError, filename: str) -> bool:
    text = str(err)
    return text.startswith(filename + ":") or text.rstrip().endswith("errors") or "error:" in text.splitlines()[0]


def check_ir(text: str) -> None:
    try:
        mod = dpl.parse(text, "fuzz.ir")
    except DplError as err:
        assert located(err, "fuzz.ir"), str(err)[:500]
        return
    again = dpl.parse(mod.script(), "again.ir")  # whatever parses prints back to the same module
    assert again.script() == mod.script()
    fn = mod.functions.get("main")
    if fn is None or not all(getattr(p.ty, "is_static", False) and np.prod(p.ty.shape) <= 4096 for p in fn.params):
        return
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(p.ty.shape).astype(dpl.dtypes.to_numpy(p.ty.dtype)) for p in fn.params]
    try:
        with np.errstate(all="ignore"):  # exp(exp(exp(x))) overflows, as it should
            dpl.interpret(mod, *args)
    except DplError:
        pass


def check_dpl(text: str) -> None:
    try:
        dpl.parse_patterns(text, "fuzz.dpl")
    except DplError as err:
        assert located(err, "fuzz.dpl") and "root:" not in str(err), str(err)[:500]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.data())
def test_hostile_module_texts(data):
    check_ir(splice(data.draw(st.sampled_from(IR_TEXTS)), IR_PIECES, data, IR_WRAPS))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.data())
def test_hostile_pattern_files(data):
    check_dpl(splice(data.draw(st.sampled_from(DPL_TEXTS)), DPL_PIECES, data, DPL_WRAPS))


EVERY_OP_TEXT = every_op_module().script()
HOSTILE_NUMBERS = ["-3", "-1", "0", "99999999999", "9223372036854775808", "-9223372036854775808", "1e20", "nan", "inf", "n"]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.data())
def test_hostile_numbers_in_types_and_attributes(data):
    text = data.draw(st.sampled_from(IR_TEXTS + [EVERY_OP_TEXT]))
    numbers = list(re.finditer(r"(?<=[\[, =])-?\d+(\.\d+)?(e-?\d+)?(?=[\],)])", text))
    chosen = data.draw(st.lists(st.sampled_from(numbers), min_size=1, max_size=3, unique_by=lambda m: m.start()))
    for m in sorted(chosen, key=lambda m: -m.start()):
        text = text[:m.start()] + data.draw(st.sampled_from(HOSTILE_NUMBERS)) + text[m.end():]
    check_ir(text)


if __name__ == "__main__":  # a longer campaign: python tests/test_hostile_fuzz.py 5000
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for test in (test_hostile_module_texts, test_hostile_pattern_files, test_hostile_numbers_in_types_and_attributes):
        campaign = settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        campaign(given(st.data())(test.hypothesis.inner_test))()
        print(test.__name__, n, "examples ok")
