"""dpl.apply's flow as a list of named passes (dpl.pipeline): the default list from the switches,
the text form both ways, a user's own pass, the instruments, and ``dpl fuse --pipeline /
--time-passes``."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import attrs
import pytest

import dpl
from dpl.cli import main
from dpl.errors import DplError
from dpl.ir import structural_equal, structural_hash
from dpl.pipeline import (
    PASSES, ByPattern, Fold, FuseOpsPass, Pass, PassInstrument, PassTimings, Rewrites, as_pipeline, default_pipeline,
    parse_pipeline,
)
from dpl.transform import fuse_ops

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SWITCHES = ("rewrites", "fold", "merge_products", "split_slices", "composites", "fuse", "bind_constants",
            "annotate_codegen", "allow_leaks", "fuse_reductions", "views", "multi_output", "rematerialize")


@pytest.fixture(scope="module")
def mlp():
    return dpl.parse((EXAMPLES / "llama_mlp.ir").read_text())


def test_the_default_pipeline_names_every_pass_in_order():
    assert [p.text() for p in default_pipeline()] == ["rewrites", "fold", "merge-products", "split-slices", "by-pattern",
                                                        "fuse-ops"]
    assert [p.text() for p in default_pipeline(fold=False, fuse=False, views=False)] == [
        "rewrites", "merge-products", "split-slices", "by-pattern"]
    assert default_pipeline(views=False, fuse_reductions=True)[-1].text() == "fuse-ops{fuse-reductions=true,views=false}"


@pytest.mark.parametrize("seed", range(12))
def test_the_text_form_reads_back_as_the_same_passes(seed):
    import random

    rng = random.Random(seed)
    switches = {k: rng.random() < 0.5 for k in SWITCHES}
    passes = default_pipeline(**switches)
    text = ",".join(p.text() for p in passes)
    if passes:
        assert parse_pipeline(text) == passes
        assert as_pipeline([text]) == passes == as_pipeline(passes)


@pytest.mark.parametrize("switches", [{}, {"fuse": False}, {"annotate_codegen": False, "views": False},
                                      {"rewrites": False, "fold": False, "fuse_reductions": True},
                                      {"composites": False, "multi_output": False, "rematerialize": False}])
def test_a_pipeline_in_text_computes_what_the_switches_do(mlp, switches):
    want = dpl.apply(mlp, ["rewrites", "llm"], **switches)
    text = ",".join(p.text() for p in default_pipeline(**switches))
    got = dpl.apply(mlp, ["rewrites", "llm"], pipeline=text)
    assert structural_equal(got, want)


def test_fuse_ops_alone_with_tvms_options_is_tvms_grouping(mlp):
    got = dpl.apply(mlp, pipeline="fuse-ops{views=false,multi-output=false,rematerialize=false}")
    assert structural_equal(got, fuse_ops(mlp))


def test_no_pass_changes_its_input_and_the_instruments_see_each(mlp):
    before = structural_hash(mlp)
    seen = []

    class Spy(PassInstrument):
        def before(self, pass_, mod):
            seen.append(("before", pass_.name, structural_hash(mod)))

        def after(self, pass_, mod, result, seconds):
            assert seconds >= 0
            seen.append(("after", pass_.name, structural_hash(mod)))

    timings = PassTimings()
    dpl.apply(mlp, ["rewrites", "llm"], instruments=[Spy(), timings])
    assert structural_hash(mlp) == before
    names = [p.name for p in default_pipeline()]
    assert [s[1] for s in seen] == [n for n in names for _ in (0, 1)]
    for (_, _, a), (_, _, b) in zip(seen[::2], seen[1::2]):
        assert a == b  # the module a pass was given is the one it left alone
    assert [r[0] for r in timings.rows] == names
    assert [r[2] for r in timings.rows][-2:] == [True, True]  # by-pattern and fuse-ops changed the module
    table = timings.table()
    assert all(n in table for n in names) and table.splitlines()[-1].startswith("total")


def test_a_users_own_pass_runs_in_the_list(mlp):
    @attrs.frozen
    class Rename(Pass):
        name = "rename-main"
        suffix: str = "_v2"

        def run(self, mod, ctx):
            fn = mod["main"]
            return dpl.Module([attrs.evolve(fn, name="main" + self.suffix)])

    passes = [*default_pipeline(fuse=False, composites=False), Rename()]
    out = dpl.apply(mlp, pipeline=passes)
    assert "main_v2" in out.functions and "main" not in out.functions


def test_the_trace_sees_the_module_the_fusion_passes_start_from(mlp):
    trace = dpl.Trace()
    out = dpl.apply(mlp, ["rewrites", "llm"], trace=trace, pipeline=[Rewrites(), Fold(), ByPattern(), FuseOpsPass()])
    assert trace.source is mlp and trace.result is out
    assert structural_equal(trace.rewritten, Fold().run(Rewrites().run(mlp, _ctx(trace.patterns)), None))
    assert trace.accepted()  # the composites' decisions are recorded


def _ctx(patterns):
    from dpl.pipeline import PassContext

    return PassContext(patterns)


@pytest.mark.parametrize("text, message", [
    ("rewrite", "unknown pass 'rewrite'; did you mean 'rewrites'?"),
    ("fuse-ops{view=false}", "pass 'fuse-ops' has no option 'view'"),
    ("fuse-ops{views=maybe}", "option 'views' of pass 'fuse-ops' takes true or false, got 'maybe'"),
    ("fold,,fuse-ops", "cannot read the pipeline 'fold,,fuse-ops' at column 6"),
    ("", "the pipeline names no pass"),
    ("fold{", "cannot read the pipeline 'fold{' at column 1"),
])
def test_a_bad_pipeline_is_named(text, message):
    with pytest.raises(DplError, match=None) as err:
        parse_pipeline(text)
    assert message in str(err.value)


def test_every_pass_has_a_name_and_a_docstring():
    assert set(PASSES) == {"rewrites", "convert-layout", "fold", "merge-products", "split-slices", "by-pattern", "fuse-ops"}
    for name, cls in PASSES.items():
        assert cls.name == name and cls.__doc__


def test_dpl_fuse_times_its_passes_and_takes_a_pipeline(capsys):
    src = str(EXAMPLES / "llama_mlp.ir")
    assert main(["fuse", src, "-p", "llm", "--time-passes"]) == 0
    out = capsys.readouterr()
    assert "func main" in out.out and "pass" not in out.out.split("\n")[0]
    lines = out.err.strip().splitlines()
    assert lines[0].split() == ["pass", "ms", "share", "changed"]
    assert [line.split()[0] for line in lines[1:]] == [p.name for p in default_pipeline()] + ["total"]

    assert main(["fuse", src, "-p", "llm", "--json", "--time-passes", "--pipeline", "by-pattern,fuse-ops{views=false}"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [p["pass"] for p in report["passes"]] == ["by-pattern", "fuse-ops{views=false}"]
    want = dpl.apply(dpl.parse(Path(src).read_text()), ["llm"], pipeline="by-pattern,fuse-ops{views=false}")
    assert report["module"] == want.script()

    assert main(["fuse", src, "--pipeline", "fold", "--no-auto"]) == 1
    assert "cannot be combined with --no-auto" in capsys.readouterr().err
    assert main(["fuse", src, "--pipeline", "fuse-opps"]) == 1
    assert "did you mean 'fuse-ops'" in capsys.readouterr().err


def test_combinations_of_switches_give_distinct_lists():
    lists = {tuple(p.text() for p in default_pipeline(**dict(zip(("fold", "fuse", "views"), bits))))
             for bits in itertools.product((False, True), repeat=3)}
    assert len(lists) == 6  # views means nothing without fuse-ops: 8 combinations, 6 lists
