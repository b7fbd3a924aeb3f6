"""Hostile input that used to hang dpl or end in an internal error (issue 33), now a located
diagnostic: a rewrite that contains its own match, a `.npz` sidecar that lies about its
entries, check hooks that raise or answer with an array, and ONNX nodes with malformed inputs.

Each is tried as a user meets it: the `dpl` command (exit 1 with `file:line:col: error:`, never
exit 3 or a traceback) or `dpl.apply` / `dpl.load` / `dpl.from_onnx` raising a DplError that
points at the rule, the constant or the node."""

from __future__ import annotations

import subprocess
import sys
import zipfile

import numpy as np
import pytest

import dpl
import needs
from dpl.errors import DplError

MODULE = """func main(x: f32[4]) -> f32[4] {
  y = nn.relu(x)
  return y
}
"""


def dpl_cli(tmp_path, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "dpl", *args], capture_output=True, text=True, cwd=tmp_path, timeout=timeout)


def assert_located(result, where: str, *words: str) -> None:
    """Exit 1 with an error at ``where`` (``file:line:col``) whose text holds ``words``."""
    assert result.returncode == 1, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr, result.stderr[-2000:]
    assert f"{where}: error:" in result.stderr, result.stderr[-2000:]
    for w in words:
        assert w in result.stderr, (w, result.stderr[-2000:])


# -- rewrites bounded by growth ----------------------------------------------------------------


def test_a_rewrite_containing_its_own_match_stops_with_the_rule_located(tmp_path):
    (tmp_path / "m.ir").write_text(MODULE)
    (tmp_path / "grow.dpl").write_text("# doubles the module every round\nrewrite grow {\n  out = nn.relu(x) => nn.relu(nn.relu(x))\n}\n")
    r = dpl_cli(tmp_path, "fuse", "-p", "grow.dpl", "m.ir")
    assert_located(r, "grow.dpl:2:1", "rewrite 'grow'", "MAX_REWRITE_GROWTH", "rewrite grow {")


def test_dpl_apply_raises_the_growth_error_naming_the_rule():
    from dpl.limits import LimitError
    from dpl.pattern.rewrite import RewriteGrowthError, RewriteNotConverged

    rules = dpl.parse_patterns("rewrite grow {\n  out = nn.relu(x) => nn.relu(add(nn.relu(x), x))\n}\n", "rules.dpl")
    with pytest.raises(RewriteGrowthError) as err:
        dpl.apply(dpl.parse(MODULE), rules)
    assert isinstance(err.value, RewriteNotConverged) and isinstance(err.value, LimitError)
    assert str(err.value).startswith("rules.dpl:1:1: error: rewrite 'grow' grew function 'main'")


def test_a_rewrite_cycle_names_the_rule_at_its_line(tmp_path):
    (tmp_path / "m.ir").write_text(MODULE)
    (tmp_path / "cycle.dpl").write_text("\nrewrite spin {\n  out = nn.relu(x) => nn.relu(negative(negative(x)))\n}\n")
    r = dpl_cli(tmp_path, "fuse", "-p", "cycle.dpl", "m.ir")
    assert_located(r, "cycle.dpl:2:1", "rewrite 'spin' did not converge")


def test_a_rewrite_that_grows_within_the_limit_still_applies():
    rules = dpl.parse_patterns("rewrite split { out = nn.relu(x) => maximum(x, multiply(x, 0.0)) }", "rules.dpl")
    out = dpl.apply(dpl.parse(MODULE), rules, fuse=False)
    assert "maximum" in out.script() and "nn.relu" not in out.script()


# -- the .npz sidecar --------------------------------------------------------------------------

WEIGHT = np.arange(100, dtype=np.float32)
SAVED = """const w: f32[100]
func main(x: f32[100]) -> f32[100] {
  y = add(x, w)
  return y
}
"""


def npy(shape, descr="<f4", data=b"") -> bytes:
    """A .npy entry whose header says ``shape`` and ``descr``, whatever ``data`` holds."""
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    header += " " * ((64 - (11 + len(header)) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data


def saved(tmp_path, entries: dict, compression=zipfile.ZIP_STORED):
    (tmp_path / "m.ir").write_text(SAVED)
    with zipfile.ZipFile(tmp_path / "m.ir.npz", "w", compression) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return tmp_path / "m.ir"


def test_a_saved_module_still_round_trips(tmp_path):
    mod = dpl.parse(SAVED.replace("f32[100]\n", "f32[100] = [%s]\n" % ", ".join(map(str, WEIGHT.tolist())), 1))
    dpl.save(mod, tmp_path / "m.ir")
    assert zipfile.ZipFile(tmp_path / "m.ir.npz").namelist() == ["w.npy"]
    np.testing.assert_array_equal(dpl.load(tmp_path / "m.ir")["main"].bindings[0].value.args[1].value, WEIGHT)


def test_a_bfloat16_constant_round_trips_through_the_sidecar(tmp_path):
    # NumPy stores ml_dtypes' bfloat16 as raw 2-byte items ('<V2'): read back as the declared bf16
    mod = dpl.parse(SAVED.replace("f32", "bf16").replace("bf16[100]\n", "bf16[100] = [%s]\n" % ", ".join(["1.5"] * 100), 1))
    dpl.save(mod, tmp_path / "m.ir")
    again = dpl.load(tmp_path / "m.ir")
    assert again.script() == mod.script() and str(again["main"].bindings[0].value.args[1].value.dtype) == "bfloat16"


@pytest.mark.parametrize("command", ["print", "run"])
def test_a_sidecar_header_declaring_2_40_elements_is_refused_before_reading(tmp_path, command):
    saved(tmp_path, {"w.npy": npy((2**40,))})
    r = dpl_cli(tmp_path, command, "m.ir")
    assert_located(r, "m.ir:1:7", "constant 'w'", "f32[1099511627776]", "declared f32[100]")


def test_a_sidecar_entry_as_large_as_its_declaration_but_without_the_data(tmp_path):
    path = saved(tmp_path, {"w.npy": npy((2**40,))})
    path.write_text(SAVED.replace("f32[100]", "f32[1099511627776]"))
    r = dpl_cli(tmp_path, "print", "m.ir")
    assert_located(r, "m.ir:1:7", "constant 'w'", "0 bytes of data", "4398046511104")


@pytest.mark.parametrize("entry, words", [
    (npy((4, 25), data=WEIGHT.tobytes()), ["holds f32[4, 25], not the declared f32[100]"]),
    (npy((100,), descr="<f8", data=WEIGHT.astype(np.float64).tobytes()), ["holds f64[100]"]),
    (npy((100,), data=WEIGHT.tobytes()[:40]), ["40 bytes of data where its header declares 400"]),
    (npy((100,), descr="|O"), ["Python objects"]),
    (b"\x93NUMPY\x01\x00\xff\xff{'descr': ", ["no readable .npy header"]),
], ids=["shape", "dtype", "truncated", "objects", "header"])
def test_a_bad_sidecar_entry_is_reported_at_its_declaration(tmp_path, entry, words):
    path = saved(tmp_path, {"w.npy": entry})
    with pytest.raises(DplError) as err:
        dpl.load(path)
    assert str(err.value).startswith(f"{path}:1:7: error: constant 'w'"), str(err.value)
    for w in words:
        assert w in str(err.value)


def test_a_sidecar_that_is_no_zip_is_reported_at_the_first_declaration(tmp_path):
    path = saved(tmp_path, {})
    (tmp_path / "m.ir.npz").write_bytes(b"not a zip file at all")
    r = dpl_cli(tmp_path, "print", "m.ir")
    assert_located(r, "m.ir:1:7", "m.ir.npz")


def test_entries_the_module_never_names_are_not_read(tmp_path):
    # a zip bomb (64 MiB of zeros in about 64 KB) and an entry whose header would exhaust memory:
    # neither is named by the module, so neither is inflated
    bomb = npy((16 * 2**20,), data=bytes(64 * 2**20))
    path = saved(tmp_path, {"w.npy": npy((100,), data=WEIGHT.tobytes()), "junk.npy": bomb, "huge.npy": npy((2**40,))},
                 zipfile.ZIP_DEFLATED)
    import tracemalloc

    dpl.load(path)  # once before measuring: the first load also imports the op registry and the grammar
    tracemalloc.start()
    try:
        mod = dpl.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, peak
    np.testing.assert_array_equal(mod["main"].bindings[0].value.args[1].value, WEIGHT)


# -- check hooks -------------------------------------------------------------------------------

HOOKED = "# a rule with a hook\n{kind} {{\n  out = nn.relu(x)\n  check {hook}\n{tail}}}\n"


def _rules(kind: str, hook: str):
    tail = "  => exp(x)\n" if kind == "rewrite r" else ""
    return dpl.parse_patterns(HOOKED.format(kind=kind, hook=hook, tail=tail), "hooks.dpl")


@pytest.fixture
def hooks():
    from dpl.lang.hooks import unregister_hook

    @dpl.check_hook("hostile.raises", replace=True)
    def raises(view):
        raise KeyError("no such thing")

    @dpl.check_hook("hostile.array", replace=True)
    def array(view):
        return view.expr("x").ty.shape == np.array([4, 4])  # an elementwise comparison, not a bool

    @dpl.check_hook("hostile.nothing", replace=True)
    def nothing(view):
        pass

    yield
    for name in ("hostile.raises", "hostile.array", "hostile.nothing"):
        unregister_hook(name)


@pytest.mark.parametrize("kind", ["pattern k.r", "rewrite r"])
@pytest.mark.parametrize("hook, words", [
    ("hostile.raises", ["raised KeyError", "no such thing"]),
    ("hostile.array", ["returned a NumPy array of shape (2,)"]),
    ("hostile.nothing", ["returned None"]),
])
def test_a_failing_check_hook_names_the_rule_the_hook_and_the_rules_line(hooks, kind, hook, words):
    from dpl.lang.hooks import CheckHookError

    rule = "k.r" if kind.startswith("pattern") else "r"
    with pytest.raises(CheckHookError) as err:
        dpl.apply(dpl.parse(MODULE), _rules(kind, hook))
    text = str(err.value)
    assert text.startswith(f"hooks.dpl:2:1: error: check hook '{hook}' of rule '{rule}'"), text
    for w in words:
        assert w in text


# -- the ONNX importer -------------------------------------------------------------------------


def onnx_cases():
    onnx = needs.package("onnx")
    from onnx import TensorProto as T
    from onnx import helper, numpy_helper

    def model(node, inputs, output, inits=()):
        graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                                  [helper.make_tensor_value_info(*output)],
                                  [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])

    x34 = [("x", T.FLOAT, [3, 4])]
    return onnx, {
        "clip_vector_min": (model(helper.make_node("Clip", ["x", "lo"], ["y"], name="clip"), x34, ("y", T.FLOAT, [3, 4]),
                                  [("lo", np.array([0.0, 1.0], np.float32))]),
                            "'clip' (Clip", "min (input 'lo') must be a scalar, got a tensor of shape [2]"),
        "gather_elements_ranks": (model(helper.make_node("GatherElements", ["x", "i"], ["y"], name="ge", axis=0),
                                        x34 + [("i", T.INT64, [2])], ("y", T.FLOAT, ["n"])),
                                  "'ge' (GatherElements", "indices of rank 1 (i64[2]) and data of rank 2"),
        "gather_nd_0d": (model(helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd"), x34, ("y", T.FLOAT, [4]),
                               [("i", np.array(1, np.int64))]),
                         "'gnd' (GatherND", "indices are 0-d"),
        "conv_symbolic_kernel": (model(helper.make_node("Conv", ["x", "w"], ["y"], name="conv"),
                                       [("x", T.FLOAT, [1, 2, 8, 8]), ("w", T.FLOAT, [3, 2, "k", 3])], ("y", T.FLOAT, [1, 3, "a", "b"])),
                                 "'conv' (Conv", "symbolic spatial dimension 'k'"),
        "cumsum_nan_axis": (model(helper.make_node("CumSum", ["x", "a"], ["y"], name="cs"), x34, ("y", T.FLOAT, [3, 4]),
                                  [("a", np.array(np.nan, np.float32))]),
                            "'cs' (CumSum", "axis (input 'a') must hold integers, got [nan]"),
        "dropout_vector_training_mode": (model(helper.make_node("Dropout", ["x", "r", "t"], ["y"], name="drop"), x34,
                                               ("y", T.FLOAT, [3, 4]), [("r", np.array(0.5, np.float32)), ("t", np.array([True, False]))]),
                                         "'drop' (Dropout", "training_mode (input 't') must be a scalar"),
    }


ONNX_CASES = ["clip_vector_min", "gather_elements_ranks", "gather_nd_0d", "conv_symbolic_kernel", "cumsum_nan_axis",
              "dropout_vector_training_mode"]


@pytest.mark.parametrize("case", ONNX_CASES)
def test_a_malformed_onnx_node_is_a_frontend_error_naming_it(case):
    from dpl.frontend import FrontendError

    _, cases = onnx_cases()
    model, node, words = cases[case]
    with pytest.raises(FrontendError) as err:
        dpl.from_onnx(model)
    assert f"ONNX node #0 {node}, opset 17): " in str(err.value) and words in str(err.value), str(err.value)


@pytest.mark.parametrize("case", ["cumsum_nan_axis", "conv_symbolic_kernel"])
def test_dpl_print_of_a_malformed_onnx_model_exits_1(tmp_path, case):
    onnx, cases = onnx_cases()
    model, node, words = cases[case]
    onnx.save(model, tmp_path / "model.onnx")
    r = dpl_cli(tmp_path, "print", "model.onnx")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert node in r.stderr and words in r.stderr, r.stderr[-2000:]
