"""``dpl ops``: the op registry as a table, one op in full, JSON; and the table's claims checked
against the code they come from: an op the table says has a C kernel lowers to kernel IR (and
the CUDA emitter emits it), one it says has none does not, and every call's pattern kind is
among the kinds listed for its op."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dpl
from dpl.cli import main
from dpl.ops import all_ops, op_kind

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *args) -> tuple[int, str, str]:
    code = main(["ops", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def ops_json(capsys) -> dict[str, dict]:
    code, out, _ = run(capsys, "--json")
    assert code == 0
    return {row["name"]: row for row in json.loads(out)["ops"]}


def test_the_table_lists_every_registered_op(capsys):
    code, out, _ = run(capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["op", "arguments", "kind", "C", "CUDA", "attributes"]
    assert [line.split()[0] for line in lines[1:-1]] == list(all_ops())
    assert lines[-1].startswith(f"{len(all_ops())} ops.")
    softmax = next(line for line in lines if line.startswith("nn.softmax "))
    assert softmax.split() == ["nn.softmax", "x", "out-ewise-fusable", "yes", "yes", "axis=-1"]
    take = next(line for line in lines if line.startswith("take "))
    assert take.split()[1:6] == ["x,", "idx", "opaque", "no", "no"]
    cumsum = next(line for line in lines if line.startswith("cumsum "))
    assert cumsum.split() == ["cumsum", "x", "opaque", "no", "no", "axis=<axis>", "dtype=none"]


def test_one_op_in_full(capsys):
    code, out, _ = run(capsys, "add")
    assert code == 0
    assert out.splitlines()[:2] == ["add(a, b)", "  a + b"]
    assert "  kind         elemwise or broadcast" in out
    assert "the call decides: dpl/ops/elementwise.py:" in out and "only a pure broadcast" in out
    assert "  C kernel     yes (its C template)" in out and "  C template   ({0} + {1})" in out
    code, out, _ = run(capsys, "nn.layer_norm")
    assert out.splitlines()[0] == "nn.layer_norm(x, gamma, beta, axes=[-1], epsilon=1e-05, center=true, scale=true)"
    assert "  C kernel     yes (its rule dpl.kernel.rules._layer_norm)" in out
    code, out, _ = run(capsys, "split")
    assert "indices_or_sections: ints_or_int = required" in out
    assert "  C kernel     yes (the tuple-item rule dpl.kernel.rules.tuple_item, one item at a time)" in out
    code, out, _ = run(capsys, "take")
    assert "  C kernel     no (its rule dpl.kernel.rules._take only raises LoweringError" in out and "  CUDA kernel  no" in out


def test_json(capsys):
    code, out, _ = run(capsys, "--json")
    data = json.loads(out)
    assert code == 0 and set(data) == {"ops", "count"} and data["count"] == len(all_ops())
    keys = {"name", "signature", "arguments", "arity", "attributes", "kinds", "kind_by_call", "kind_rule", "dtypes",
            "c_kernel", "cuda_kernel", "lowering", "c_template", "doc"}
    assert all(set(row) == keys for row in data["ops"])
    code, out, _ = run(capsys, "where", "--json")
    where = json.loads(out)
    assert where["arguments"] == ["c", "a", "b"] and where["arity"] == [3, 3] and where["kinds"] == ["elemwise", "broadcast"]
    assert where["c_template"] == "({0} ? {1} : {2})" and where["dtypes"] is None
    code, out, _ = run(capsys, "nn.rms_norm", "--json")
    attrs = json.loads(out)["attributes"]
    assert attrs == [{"name": "axes", "kind": "axes", "required": False, "default": [-1]},
                     {"name": "epsilon", "kind": "float", "required": False, "default": 1e-05}]


def test_an_unknown_name_is_an_error_with_a_did_you_mean(capsys):
    code, out, err = run(capsys, "nn.sofmax")
    assert code == 1 and out == ""
    assert "unknown op 'nn.sofmax'" in err and "did you mean 'nn.softmax'" in err and "Traceback" not in err
    code, out, err = run(capsys, "sofmax", "--json")
    assert code == 1 and out == "" and "did you mean 'nn.softmax'" in err


# -- the claims, against the code ----------------------------------------------------------------

def _one_op(op: str, *shapes, dtype: str = "f32", **attrs) -> dpl.Function:
    fb = dpl.FunctionBuilder("f", attrs={"Primitive": True})
    params = [fb.param(f"p{i}", dt, shape) for i, (dt, shape) in enumerate(shapes)]
    return fb.ret(fb.emit(op, *params, name="out", **attrs))


F32 = "f32"
ONE_OP_FUNCTIONS = {
    "add": lambda: _one_op("add", (F32, (4, 8)), (F32, (8,))),
    "exp": lambda: _one_op("exp", (F32, (4, 8))),
    "where": lambda: _one_op("where", ("bool", (4, 8)), (F32, (4, 8)), (F32, (4, 8))),
    "matmul": lambda: _one_op("matmul", (F32, (4, 8)), (F32, (8, 3))),
    "nn.softmax": lambda: _one_op("nn.softmax", (F32, ("n", 8))),
    "sum": lambda: _one_op("sum", (F32, (4, 8)), axis=[1]),
    "take": lambda: _one_op("take", (F32, (10, 8)), ("i64", (3,)), axis=0),
    "reshape": lambda: _one_op("reshape", (F32, (4, 8)), shape=[8, 4]),
    "split": lambda: _one_op("split", (F32, (4, 8)), indices_or_sections=2, axis=1),
    "cumsum": lambda: _one_op("cumsum", (F32, (4, 8)), axis=1),
}


@pytest.mark.parametrize("op", list(ONE_OP_FUNCTIONS))
def test_the_kernel_columns_say_what_lowers(op, capsys):
    from dpl.backends.cuda.emitter import emit_cuda
    from dpl.kernel import LoweringError, lower_function

    row = ops_json(capsys)[op]
    fn = ONE_OP_FUNCTIONS[op]()
    try:
        kernel = lower_function(fn)
    except LoweringError:
        kernel = None
    assert (kernel is not None) == row["c_kernel"], (op, row["lowering"])
    assert row["cuda_kernel"] == row["c_kernel"]
    if kernel is not None:
        assert "__global__" in emit_cuda(kernel).code


def test_the_lowering_column_has_both_answers(capsys):
    rows = ops_json(capsys)
    assert {r["c_kernel"] for r in rows.values()} == {True, False}  # the table is not one answer for all


def test_every_calls_kind_is_among_its_ops_kinds(capsys):
    rows = ops_json(capsys)
    seen = 0
    modules = [dpl.parse(p.read_text()) for p in sorted((ROOT / "examples").glob("*.ir"))]
    modules += [dpl.Module([ONE_OP_FUNCTIONS[op]()]) for op in ONE_OP_FUNCTIONS]
    for mod in modules:
        for fn in mod.functions.values():
            for b in fn.bindings:
                if isinstance(b.value, dpl.Call) and isinstance(b.value.op, str):
                    kind = op_kind(b.value).name.lower().replace("_", "-")
                    assert kind in rows[b.value.op]["kinds"], (b.value.op, kind, rows[b.value.op]["kinds"])
                    seen += 1
    assert seen > 20
