"""The limits of dpl/limits.py: just inside each one the input works, just past it the error
names the limit (the hostile reproducers themselves are goldens in ir_errors/ and dpl_errors/).
Also the inputs that must give a correct answer rather than an error, and where imports may read."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import needs

import dpl
from dpl import limits
from dpl.errors import DplError
from dpl.lang import load_rules, parse_rules
from dpl.limits import LimitError


def nested_calls(depth: int) -> str:
    return "func main(x: f32[4]) -> f32[4] {\n  y = " + "negative(" * depth + "x" + ")" * depth + "\n  return y\n}\n"


def test_nesting_just_inside_the_limit_parses_prints_and_runs():
    depth = limits.MAX_NESTING - 4  # the module, function and binding take the other levels
    mod = dpl.parse(nested_calls(depth))
    assert dpl.parse(mod.script()).script() == mod.script()
    x = np.random.default_rng(0).standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(dpl.interpret(mod, x), x if depth % 2 == 0 else -x)
    with pytest.raises(LimitError, match="MAX_NESTING"):
        dpl.parse(nested_calls(limits.MAX_NESTING + 1))


def call_chain(depth: int) -> str:
    funcs = [f"func f{i}(x: f32[4]) -> f32[4] {{\n  y = f{i + 1}(x)\n  return y\n}}\n" for i in range(depth)]
    return "\n".join(funcs + [f"func f{depth}(x: f32[4]) -> f32[4] {{\n  y = negative(x)\n  return y\n}}\n"])


def test_calls_nested_up_to_the_limit_run():
    mod = dpl.parse(call_chain(limits.MAX_CALL_DEPTH))
    x = np.random.default_rng(0).standard_normal(4).astype(np.float32)
    np.testing.assert_array_equal(dpl.interpret(mod, x, entry="f0"), -x)
    with pytest.raises(LimitError, match="MAX_CALL_DEPTH"):
        dpl.parse(call_chain(limits.MAX_CALL_DEPTH + 1))


def alternatives(n: int) -> str:
    return "codegen t\npattern p {\n  y = " + " | ".join(["nn.relu(x)"] * (n - 1) + ["exp(x)"]) + "\n}\n"


def test_alternatives_up_to_the_limit_match():
    patterns = dpl.parse_patterns(alternatives(limits.MAX_ALTERNATIVES))
    mod = dpl.parse("func main(x: f32[4]) -> f32[4] {\n  y = exp(x)\n  return y\n}\n")
    assert '@composite("t.p")' in dpl.fuse_ops_by_pattern(mod, patterns).script()
    with pytest.raises(LimitError, match="MAX_ALTERNATIVES"):
        dpl.parse_patterns(alternatives(limits.MAX_ALTERNATIVES + 1))


def test_alternatives_in_the_python_api():
    x = dpl.wildcard()
    p = dpl.is_op("exp")(x)
    for _ in range(limits.MAX_ALTERNATIVES - 1):
        p = p | dpl.is_op("nn.relu")(x)
    with pytest.raises(LimitError, match=r"test_limits.py:\d+: 65 alternatives .* MAX_ALTERNATIVES = 64"):
        p | dpl.is_op("nn.gelu")(x)
    with pytest.raises(LimitError):  # a right-leaning tree counts the same
        dpl.is_op("nn.gelu")(x) | p


@pytest.mark.parametrize("literal, dtype, ok", [
    ("127:i8", "i8", True), ("128:i8", "i8", False), ("-128:i8", "i8", True), ("255:u8", "u8", True), ("-1:u8", "u8", False),
    ("9223372036854775807", "i64", True), ("9223372036854775808", "i64", False), ("65504.0:f16", "f16", True),
    ("1e5:f16", "f16", False), ("1:bool", "bool", True), ("2:bool", "bool", False), ("inf:f16", "f16", True),
])
def test_literal_ranges_per_dtype(literal, dtype, ok):
    text = f"func main(x: {dtype}[2]) -> {dtype}[2] {{\n  y = maximum(x, {literal})\n  return y\n}}\n"
    if ok:
        const = dpl.parse(text).functions["main"].bindings[0].value.args[1]
        assert float(const.value) == float(literal.split(":")[0])
    else:
        with pytest.raises(DplError, match="out of the range"):
            dpl.parse(text)


def test_shape_limits_at_type_checking_time():
    elements = limits.MAX_TENSOR_ELEMENTS
    assert dpl.TensorType((elements // 8, 8), "i8").shape == (elements // 8, 8)
    with pytest.raises(LimitError, match="MAX_TENSOR_ELEMENTS"):
        dpl.TensorType((elements, 2), "i8")
    with pytest.raises(LimitError, match="MAX_TENSOR_BYTES"):
        dpl.TensorType((elements,), "f64")
    assert dpl.TensorType(("n", elements), "bool").shape == ("n", elements)  # symbolic dims are known at run time


def test_softmax_over_a_zero_length_axis_is_an_empty_result():
    mod = dpl.parse("func main(x: f32[4, 0]) -> f32[4, 0] {\n  y = nn.softmax(x, axis=1)\n  z = nn.log_softmax(y, axis=1)\n  return z\n}\n")
    assert dpl.interpret(mod, np.zeros((4, 0), np.float32)).shape == (4, 0)


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dpl", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_dpl_run_prints_a_nested_tuple_result(tmp_path):
    path = tmp_path / "nested.ir"
    path.write_text("func main(x: f32[4]) -> ((f32[4], f32[4]), f32[4]) {\n  y = exp(x)\n  t = ((x, y), y)\n  return t\n}\n")
    r = run_cli("run", str(path))
    assert r.returncode == 0, r.stderr
    assert [line.split(":")[0] for line in r.stdout.splitlines()] == ["output 0", "output 1", "output 2"]


def test_dpl_run_refuses_a_device_without_reading_it():
    start = time.monotonic()
    r = run_cli("run", "/dev/zero")
    assert r.returncode == 1 and "'/dev/zero' is not a regular file" in r.stderr
    assert time.monotonic() - start < 60


def test_where_lists_are_bounded_when_they_are_computed():
    patterns = dpl.parse_patterns("codegen t\npattern p {\n  y = exp(x)\n  where [1] * (rank(x) * 99999999999) == [1]\n}\n")
    mod = dpl.parse("func main(x: f32[4]) -> f32[4] {\n  y = exp(x)\n  return y\n}\n")
    assert "composite" not in dpl.fuse_ops_by_pattern(mod, patterns).script()  # the predicate does not hold
    small = dpl.parse_patterns("codegen t\npattern p {\n  y = exp(x)\n  where [1] * rank(x) == [1]\n}\n")
    assert "composite" in dpl.fuse_ops_by_pattern(mod, small).script()


# -- strings -----------------------------------------------------------------------------------


def test_strings_print_escaped_and_keep_utf8():
    mod = dpl.parse('@composite("a\\nb caf\u00e9 \\u00e9 \\"q\\" \\\\")\nfunc main(x: f32[4]) -> f32[4] {\n  return x\n}\n')
    assert mod.functions["main"].attrs["Composite"] == 'a\nb caf\u00e9 \u00e9 "q" \\'
    text = mod.script()
    assert text.splitlines()[0] == '@composite("a\\nb caf\u00e9 \u00e9 \\"q\\" \\\\")'
    assert dpl.parse(dpl.parse(text).script()).script() == text


def test_dpl_strings_read_as_written():
    rules = parse_rules('codegen t\npattern p {\n  y = exp(x)\n  where attr(y, "caf\u00e9\\n\\u00e9") == 1\n}\n')
    assert rules  # the literal itself is checked through the where tree below
    from dpl.lang.parser import parse_file

    tree = parse_file('codegen t\npattern p {\n  y = exp(x)\n  where attr(y, "caf\u00e9\\n\\u00e9") == 1\n}\n')
    assert tree.decls[1].body.wheres[0].left.args[1].value == "caf\u00e9\n\u00e9"


# -- imports -----------------------------------------------------------------------------------


def test_imports_stay_inside_the_importing_files_tree(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "base.dpl").write_text("pattern base.e { out = exp(x) }\n")
    (tmp_path / "top.dpl").write_text('import "lib/base.dpl"\n')
    assert [r.name for r in load_rules(str(tmp_path / "top.dpl"))] == ["base.e"]
    (tmp_path / "lib" / "up.dpl").write_text('import "../top.dpl"\n')
    with pytest.raises(DplError, match="outside the importing file's directory tree"):
        load_rules(str(tmp_path / "lib" / "up.dpl"))
    # ... unless the caller puts that directory on the search path
    (tmp_path / "lib" / "named.dpl").write_text('import "top.dpl"\n')
    assert [r.name for r in load_rules(str(tmp_path / "lib" / "named.dpl"), search_path=[str(tmp_path)])] == ["base.e"]


def test_a_symbolic_link_out_of_the_tree_is_refused(tmp_path):
    secret = tmp_path / "secret.dpl"
    secret.write_text("TOP SECRET LINE\n")
    (tmp_path / "proj").mkdir()
    os.symlink(secret, tmp_path / "proj" / "link.dpl")
    (tmp_path / "proj" / "main.dpl").write_text('import "link.dpl"\n')
    with pytest.raises(DplError) as err:
        load_rules(str(tmp_path / "proj" / "main.dpl"))
    assert "outside" in str(err.value) and "SECRET" not in str(err.value)


def test_files_that_are_not_dpl_files_are_never_read_or_quoted(tmp_path):
    (tmp_path / "secret.txt").write_text("TOP SECRET LINE\n")
    (tmp_path / "main.dpl").write_text('import "secret.txt"\n')
    for source in (str(tmp_path / "main.dpl"), str(tmp_path / "secret.txt")):
        with pytest.raises(DplError) as err:
            load_rules(source)
        assert "SECRET" not in str(err.value) and ".dpl file" in str(err.value)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "pipe.dpl")
    (tmp_path / "main.dpl").write_text('import "pipe.dpl"\n')
    with pytest.raises(DplError, match="not a regular file"):
        load_rules(str(tmp_path / "main.dpl"))


def test_source_size_limit(tmp_path, monkeypatch):
    monkeypatch.setattr("dpl.lang.sources.MAX_SOURCE_BYTES", 100)
    (tmp_path / "big.dpl").write_text("# " + "x" * 200 + "\n")
    (tmp_path / "main.dpl").write_text('import "big.dpl"\n')
    with pytest.raises(LimitError, match="MAX_SOURCE_BYTES = 100"):
        load_rules(str(tmp_path / "main.dpl"))


# -- diagnostics -------------------------------------------------------------------------------


def test_a_megabyte_string_is_not_echoed_whole():
    value = "A" * 1_000_000
    with pytest.raises(DplError) as err:
        dpl.parse(f'func main(x: f32[4]) -> f32[4] {{\n  y = nn.softmax(x, axis="{value}")\n  return y\n}}\n')
    text = str(err.value)
    assert len(text) < 2 * limits.MAX_MESSAGE + 2 * limits.MAX_EXCERPT
    assert text.startswith("<string>:2:21: error: op 'nn.softmax': attribute 'axis'")
    caret_line = text.splitlines()[2]
    assert caret_line.strip() == "^^^^" and text.splitlines()[1][len(caret_line) - 4:len(caret_line)] == "axis"


# -- ONNX constant folding ---------------------------------------------------------------------


def onnx_model(op, inits, out_type, out_shape):
    onnx = needs.package("onnx")
    from onnx import TensorProto, helper, numpy_helper

    g = helper.make_graph([helper.make_node(op, list(inits), ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                          [helper.make_tensor_value_info("y", out_type, out_shape)],
                          [numpy_helper.from_array(np.asarray(v, np.int64), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_onnx_folding_is_size_limited():
    import needs

    needs.package("onnx")
    from onnx import TensorProto

    start = time.monotonic()
    big = dpl.from_onnx(onnx_model("ConstantOfShape", {"s": [32768, 32768]}, TensorProto.FLOAT, [32768, 32768]))
    assert "full(0.0, shape=[32768, 32768])" in big.script()  # left to run time, not 4 GiB folded
    assert time.monotonic() - start < 5
    small = dpl.from_onnx(onnx_model("ConstantOfShape", {"s": [2, 3]}, TensorProto.FLOAT, [2, 3]))
    assert "full" not in small.script()  # folded
    with pytest.raises(DplError, match=r"node #0 \(Range.*MAX_TENSOR_BYTES"):
        dpl.from_onnx(onnx_model("Range", {"a": 0, "b": 2**40, "c": 1}, TensorProto.INT64, [None]))
