"""Malformed ``.dpl`` files and the full diagnostics they must produce (golden text).

Regenerate after an intended change with ``python tests/test_lang_diagnostics.py --regen``,
then read every changed ``.err`` file: the goldens are the spec of the messages.
"""

import pathlib
import sys

import pytest

from dpl.errors import DplError
from dpl.lang import parse_rules

HERE = pathlib.Path(__file__).parent / "dpl_errors"
CASES = sorted(HERE.glob("*.dpl"))


def diagnostic(path: pathlib.Path) -> str:
    try:
        parse_rules(path.read_text(), path.name)
    except DplError as err:
        return str(err) + "\n"
    return "no error\n"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_diagnostic(path):
    golden = path.with_suffix(".err")
    assert golden.exists(), f"missing golden {golden.name}: run python tests/test_lang_diagnostics.py --regen"
    assert diagnostic(path) == golden.read_text()


def test_enough_cases_and_some_with_several_errors():
    assert len(CASES) >= 40
    several = [p for p in CASES if p.with_suffix(".err").exists() and p.with_suffix(".err").read_text().rstrip().endswith("errors")]
    assert len(several) >= 3


if __name__ == "__main__" and "--regen" in sys.argv:
    for path in CASES:
        path.with_suffix(".err").write_text(diagnostic(path))
        print(path.with_suffix(".err").name)


def test_rules_given_as_a_string_to_load_patterns_point_to_parse_patterns():
    import dpl

    with pytest.raises(DplError) as err:
        dpl.load_patterns("codegen kernel\npattern p { out = nn.relu(x) }")
    assert "is neither a .dpl file nor a library name" in str(err.value)
    assert "dpl.parse_patterns(text)" in str(err.value)
    with pytest.raises(DplError) as err:
        dpl.load_patterns("no-such-file")
    assert "parse_patterns" not in str(err.value)
    assert dpl.parse_patterns("codegen kernel\npattern p { out = nn.relu(x) }").patterns
