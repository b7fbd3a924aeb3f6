"""Bad input gets a clear error, never a traceback: random damage to valid .dpl and IR texts
either still parses or raises a DplError whose text points at the file."""

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpl
from dpl.errors import DplError
from test_text_roundtrip import every_op_module

ROOT = Path(__file__).parent.parent
DPL_TEXTS = [p.read_text() for p in sorted((ROOT / "patterns").glob("*.dpl"))]
IR_TEXTS = [p.read_text() for p in sorted((ROOT / "examples").glob("*.ir"))]
PIECES = ["(", ")", "{", "}", "[", "]", ",", "=", "|", "&", "~", "?", ":", "=>", "where", "pattern", "_", "x", "1",
          "-1.5e3", '"s"', "f16", "nn.relu", "add", "...", "#", "##", "\n", " ", "import", "def", "equiv", "outputs",
          "func", "return", "@primitive", "const", "none", "inf"]


def damage(text: str, data) -> str:
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(text)))
        j = data.draw(st.integers(i, min(len(text), i + 12)))
        text = text[:i] + data.draw(st.sampled_from(PIECES + [""])) + text[j:]
    return text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_pattern_files(data):
    text = damage(data.draw(st.sampled_from(DPL_TEXTS)), data)
    try:
        dpl.parse_patterns(text, "fuzz.dpl")
    except DplError as err:
        assert str(err).startswith("fuzz.dpl:") or "errors" in str(err)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damaged_module_texts(data):
    text = damage(data.draw(st.sampled_from(IR_TEXTS)), data)
    try:
        dpl.parse(text, "fuzz.ir")
    except DplError as err:
        assert str(err).startswith("fuzz.ir:") or "errors" in str(err)


NUMBER_SWAPS = ["k", "n", "0", "1", "7", "-1", "-2", "100"]
EVERY_OP_TEXT = every_op_module().script()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_swapped_numbers_in_types_and_attributes(data):
    """Dimensions turned symbolic or zero, strides and pads turned zero or negative: type
    inference reports them (a regression: a symbolic kernel size or a zero stride crashed)."""
    text = data.draw(st.sampled_from(IR_TEXTS + [EVERY_OP_TEXT]))
    numbers = list(re.finditer(r"(?<=[\[, ])-?\d+(?=[\],])", text))
    for m in sorted(data.draw(st.lists(st.sampled_from(numbers), min_size=1, max_size=3, unique_by=lambda m: m.start())),
                    key=lambda m: -m.start()):
        text = text[:m.start()] + data.draw(st.sampled_from(NUMBER_SWAPS)) + text[m.end():]
    try:
        dpl.parse(text, "swap.ir")
    except DplError as err:
        assert str(err).startswith("swap.ir:") or "errors" in str(err)
