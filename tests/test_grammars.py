"""The grammars are LALR without conflicts (Lark logs any shift/reduce it resolves in debug
mode), and they are read from the installed package."""

import io
import logging

import pytest
from lark import Lark, logger


@pytest.mark.parametrize("name", ["dpl.lark", "ir.lark"])
def test_grammar_is_conflict_free(name):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        Lark.open_from_package("dpl.grammar", name, parser="lalr", debug=True)
    finally:
        logger.setLevel(old)
        logger.removeHandler(handler)
    assert stream.getvalue() == ""
