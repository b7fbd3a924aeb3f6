"""The Lark parsers' tables are cached on disk (Lark's ``cache=``) and handed to Lark only when
their bytes match the SHA-256 beside them: a changed or planted cache file is rewritten, never
unpickled."""

import os
import pickle
import stat

import pytest
from lark import Lark

import dpl.syntax
from dpl.syntax import open_grammar

OPTIONS = {"propagate_positions": True, "maybe_placeholders": False}
TEXT = "func main(x: f32[2]) -> f32[2] {\n  y = exp(x)\n  return y\n}"


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(dpl.syntax, "store_dir", lambda name: tmp_path / name)
    return tmp_path / "parsers"


def no_building(monkeypatch):
    def refuse(self):
        raise AssertionError("the parse tables were built, not loaded")

    monkeypatch.setattr(Lark, "_build_parser", refuse)


def test_tables_are_written_once_then_loaded(store, monkeypatch):
    open_grammar("ir.lark", **OPTIONS)
    (table,) = store.glob("ir-*.lark")
    assert stat.S_IMODE(table.stat().st_mode) == 0o600 and stat.S_IMODE(store.stat().st_mode) == 0o700
    assert stat.S_IMODE(table.with_suffix(".sha256").stat().st_mode) == 0o600
    with monkeypatch.context() as m:
        no_building(m)
        parser = open_grammar("ir.lark", **OPTIONS)
    assert parser.parse(TEXT).data


def test_a_changed_table_is_rebuilt_not_loaded(store, monkeypatch):
    open_grammar("ir.lark", **OPTIONS)
    (table,) = store.glob("ir-*.lark")
    data = bytearray(table.read_bytes())
    data[-10] ^= 0xFF
    table.write_bytes(bytes(data))
    with monkeypatch.context() as m:
        no_building(m)
        with pytest.raises(AssertionError, match="built, not loaded"):
            open_grammar("ir.lark", **OPTIONS)
    assert open_grammar("ir.lark", **OPTIONS).parse(TEXT).data
    with monkeypatch.context() as m:  # rewritten and recorded: loaded again
        no_building(m)
        open_grammar("ir.lark", **OPTIONS)


class Planted:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_is_never_unpickled(store, tmp_path):
    open_grammar("ir.lark", **OPTIONS)
    (table,) = store.glob("ir-*.lark")
    marker = tmp_path / "unpickled"
    header = table.read_bytes().split(b"\n", 1)[0]  # Lark's own check passes: only ours stops it
    table.write_bytes(header + b"\n" + pickle.dumps(Planted(marker)))
    os.chmod(table, 0o600)
    assert open_grammar("ir.lark", **OPTIONS).parse(TEXT).data
    assert not marker.exists()
