"""Hostile-but-fair input, fuzzed: the .ir and .dpl texts of examples/ and patterns/ with pieces
spliced in that broke dpl before (deep nesting, long `|` chains, huge or out-of-range numbers,
bad escapes, negative or zero dims, recursion, hostile imports). Every text either works or
ends in a DplError that points at the file; never another exception, never a hang.

Beyond the texts: rewrite rules whose replacement holds their own match (they must stop at the
growth or round limit, located at the rule), `.npz` sidecars with lying headers, check hooks that
raise or answer with arrays, and ONNX nodes with malformed inputs and attributes.

The budget is fixed (a few hundred examples, no deadline per example) so CI stays fast; the
campaign's scale (6,000 parser mutations, and the others in :data:`FUZZERS`) runs with
``python scripts/fuzz.py`` (``--count N`` for N examples per fuzzer).
"""

import io
import re
import sys
import tempfile
import zipfile
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


# -- rewrites that contain their own match -----------------------------------------------------

UNARY = ["exp", "negative", "nn.relu", "abs", "tanh", "sigmoid"]
REWRITE_MODULE = dpl.parse("""func main(x: f32[4], z: f32[4]) -> f32[4] {
  a = nn.relu(x)
  b = exp(a)
  c = add(b, z)
  d = tanh(c)
  return d
}
""")


def _replacement(data, depth: int) -> str:
    """A replacement over ``x`` (the matched operand) and ``out`` (the match itself, spelled
    again): unary chains, sums and products of these, mostly containing the match."""
    if depth == 0 or data.draw(st.integers(0, 3)) == 0:
        return data.draw(st.sampled_from(["x", "x", "MATCH"]))
    kind = data.draw(st.sampled_from(["unary", "unary", "binary"]))
    if kind == "unary":
        return f"{data.draw(st.sampled_from(UNARY))}({_replacement(data, depth - 1)})"
    op = data.draw(st.sampled_from(["add", "multiply", "maximum"]))
    return f"{op}({_replacement(data, depth - 1)}, {_replacement(data, depth - 1)})"


def check_rewrite(text: str) -> None:
    try:
        rules = dpl.parse_patterns(text, "fuzz.dpl")
        out = dpl.apply(REWRITE_MODULE, rules, fuse=False)
    except DplError as err:
        assert str(err).startswith("fuzz.dpl:"), str(err)[:500]
        return
    args = [np.linspace(-1, 1, 4, dtype=np.float32)] * 2
    with np.errstate(all="ignore"):
        dpl.interpret(out, *args)


@settings(max_examples=EXAMPLES // 6, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.data())
def test_hostile_rewrite_rules(data):
    rules = []
    for i in range(data.draw(st.integers(1, 2))):
        op = data.draw(st.sampled_from(UNARY))
        repl = _replacement(data, data.draw(st.integers(1, 4))).replace("MATCH", f"{op}(x)")
        rules.append(f"rewrite r{i} {{\n  out = {op}(x) => {repl}\n}}\n")
    check_rewrite("".join(rules))


# -- .npz sidecars -----------------------------------------------------------------------------

SIDECAR_TEXT = """const w: f32[2, 50]
const v: i32[80]
func main(x: f32[2, 50]) -> f32[2, 50] {
  y = add(x, w)
  return y
}
"""
HEADER_PIECES = ["(2, 50)", "(100,)", "(1099511627776,)", "(2, -50)", "(0,)", "()", "(99999999999999999999,)", "'<f4'", "'<f8'",
                 "'>f4'", "'|O'", "'<i4'", "'V8'", "True", "None", "{", "", "'shape'", "(2, 50, 1)", "[2, 50]"]


def _sidecar(data) -> bytes:
    """A sidecar for SIDECAR_TEXT, mutated: header fields replaced, data cut or grown, entries
    added, renamed or dropped, bytes flipped anywhere."""
    entries = {"w.npy": np.ones((2, 50), np.float32), "v.npy": np.arange(80, dtype=np.int32)}
    files = {}
    for name, value in entries.items():
        buf = io.BytesIO()
        np.lib.format.write_array(buf, value)
        files[name] = buf.getvalue()
    for _ in range(data.draw(st.integers(1, 4))):
        name = data.draw(st.sampled_from(sorted(files) + ["junk.npy"]))
        raw = files.get(name, b"")
        how = data.draw(st.sampled_from(["header", "cut", "grow", "flip", "drop", "rename"]))
        if how == "header" and b"\n" in raw:
            header_end = raw.index(b"\n") + 1
            header = raw[:header_end].decode("latin1")
            fields = list(re.finditer(r"\(.*?\)|'[^']*'|True|False", header)) or list(re.finditer(".", header))
            m = data.draw(st.sampled_from(fields))
            header = header[:m.start()] + data.draw(st.sampled_from(HEADER_PIECES)) + header[m.end():]
            raw = header.encode("latin1") + raw[header_end:]
        elif how == "cut":
            raw = raw[:data.draw(st.integers(0, len(raw)))]
        elif how == "grow":
            raw = raw + bytes(data.draw(st.integers(1, 64)))
        elif how == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw = raw[:i] + bytes([raw[i] ^ data.draw(st.integers(1, 255))]) + raw[i + 1:]
        elif how == "drop":
            files.pop(name, None)
            continue
        elif how == "rename":
            files.pop(name, None)
            name = data.draw(st.sampled_from(["w", "w.npy", "v.npy", "../w.npy", "x.npy", "w.npz"]))
        files[name] = raw
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", data.draw(st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]))) as z:
        for name, raw in files.items():
            z.writestr(name, raw)
    out = buf.getvalue()
    if data.draw(st.integers(0, 4)) == 0 and out:  # the zip itself damaged
        i = data.draw(st.integers(0, len(out) - 1))
        out = out[:i] + bytes([out[i] ^ 0xFF]) + out[i + 1:]
    return out


def check_sidecar(folder: Path, npz: bytes) -> None:
    path = folder / "fuzz.ir"
    path.write_text(SIDECAR_TEXT)
    (folder / "fuzz.ir.npz").write_bytes(npz)
    try:
        mod = dpl.load(path)
    except DplError as err:
        assert str(err).startswith(f"{path}:"), str(err)[:500]
        return
    assert mod["main"].bindings[0].value.args[1].value.shape == (2, 50)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.data())
def test_hostile_sidecars(data):
    with tempfile.TemporaryDirectory() as folder:
        check_sidecar(Path(folder), _sidecar(data))


# -- check hooks -------------------------------------------------------------------------------


def _answer(kind: str, view):
    from dpl.pattern.match import NoMatch

    answers = {"true": True, "false": False, "np.true": np.bool_(True), "array1": np.array([True]), "array2": np.array([1, 2]),
               "none": None, "one": 1, "string": "yes", "nomatch": NoMatch(None, None, "check", "no"),
               "shape": view.expr("x").ty.shape == np.array([4])}
    if kind in answers:
        return answers[kind]
    raise {"value": ValueError("bad"), "key": KeyError("x"), "recursion": RecursionError("deep"),
           "dpl": DplError("a hook's own error"), "zero": ZeroDivisionError("0")}[kind]


HOOK_ANSWERS = ["true", "false", "np.true", "array1", "array2", "none", "one", "string", "nomatch", "shape", "value", "key",
                "recursion", "dpl", "zero"]


@settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.data())
def test_hostile_check_hooks(data):
    from dpl.lang.hooks import unregister_hook

    kind = data.draw(st.sampled_from(HOOK_ANSWERS))
    dpl.check_hook("fuzz.hook", replace=True)(lambda view: _answer(kind, view))
    rule = data.draw(st.sampled_from(["pattern k.p {\n  out = OP(x)\n  check fuzz.hook\n}\n",
                                      "rewrite r {\n  out = OP(x)\n  check fuzz.hook\n  => negative(negative(x))\n}\n"]))
    text = rule.replace("OP", data.draw(st.sampled_from(["nn.relu", "exp", "add"]))).replace("add(x)", "add(x, y)")
    try:
        check_rewrite(text)  # located at the rule or applied
    finally:
        unregister_hook("fuzz.hook")


# -- ONNX nodes --------------------------------------------------------------------------------

ONNX_DIMS = st.sampled_from([0, 1, 2, 3, 4, "n"])
ONNX_VALUES = st.sampled_from([0, 1, -1, 2, 3, 2**40, float("nan"), float("inf"), 0.5, True])
# op: (inputs that are tensors, inputs that are constants, attributes that may be set)
ONNX_NODES = {
    "Clip": (1, 2, {}),
    "GatherElements": (2, 0, {"axis": st.integers(-3, 3)}),
    "GatherND": (2, 0, {"batch_dims": st.integers(0, 1)}),
    "Gather": (2, 0, {"axis": st.integers(-3, 3)}),
    "Conv": (2, 0, {"group": st.integers(0, 2), "strides": st.lists(st.integers(0, 2), min_size=1, max_size=3),
                    "pads": st.lists(st.integers(-1, 2), min_size=1, max_size=4),
                    "dilations": st.lists(st.integers(0, 2), min_size=1, max_size=3)}),
    "CumSum": (1, 1, {"exclusive": st.integers(0, 1)}),
    "Dropout": (1, 2, {}),
    "Trilu": (1, 1, {"upper": st.integers(0, 1)}),
    "Softmax": (1, 0, {"axis": st.integers(-4, 4)}),
    "Transpose": (1, 0, {"perm": st.lists(st.integers(-1, 3), min_size=1, max_size=4)}),
    "Unsqueeze": (1, 1, {}),
    "Reshape": (1, 1, {}),
}


def _onnx_node_model(onnx, data):
    from onnx import TensorProto, helper, numpy_helper

    op = data.draw(st.sampled_from(sorted(ONNX_NODES)))
    tensors, constants, attrs = ONNX_NODES[op]
    inputs, inits, names = [], [], []
    for i in range(tensors):
        shape = data.draw(st.lists(ONNX_DIMS, max_size=4))
        dtype = data.draw(st.sampled_from([TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL]))
        inputs.append(helper.make_tensor_value_info(f"t{i}", dtype, shape))
        names.append(f"t{i}")
    for i in range(constants):
        values = data.draw(st.lists(ONNX_VALUES, max_size=3))
        value = np.array(values[0] if len(values) == 1 and data.draw(st.booleans()) else values, dtype=np.float64)
        with np.errstate(invalid="ignore"):  # nan as int64: whatever the cast gives
            value = value.astype(data.draw(st.sampled_from(["float32", "int64", "bool"])))
        inits.append(numpy_helper.from_array(value, f"c{i}"))
        names.append(data.draw(st.sampled_from([f"c{i}", f"c{i}", ""])))
    chosen = {k: data.draw(v) for k, v in attrs.items() if data.draw(st.booleans())}
    node = helper.make_node(op, names, ["y"], name="fuzzed", **chosen)
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, data.draw(st.lists(ONNX_DIMS, max_size=4)))
    graph = helper.make_graph([node], "g", inputs, [output], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", data.draw(st.sampled_from([13, 17])))])


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.data())
def test_hostile_onnx_nodes(data):
    import needs
    from dpl.frontend import FrontendError

    onnx = needs.package("onnx")
    model = _onnx_node_model(onnx, data)
    try:
        with np.errstate(all="ignore"):
            dpl.from_onnx(model)
    except FrontendError as err:
        assert "Traceback" not in str(err) and "internal error" not in str(err), str(err)[:500]


# -- the campaign --------------------------------------------------------------------------------

# each fuzzer with the examples of the issue 33 campaign (the CI run uses the counts in its settings)
FUZZERS = {
    "module_texts": (test_hostile_module_texts, 2000),
    "pattern_files": (test_hostile_pattern_files, 2000),
    "numbers": (test_hostile_numbers_in_types_and_attributes, 2000),
    "rewrite_rules": (test_hostile_rewrite_rules, 500),
    "sidecars": (test_hostile_sidecars, 2000),
    "check_hooks": (test_hostile_check_hooks, 500),
    "onnx_nodes": (test_hostile_onnx_nodes, 2000),
}


def run_campaign(counts: dict[str, int], report=print) -> None:
    """Run each named fuzzer of :data:`FUZZERS` for its count of examples."""
    for name, n in counts.items():
        test = FUZZERS[name][0]
        campaign = settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        campaign(given(st.data())(test.hypothesis.inner_test))()
        report(f"{name}: {n} examples ok")


if __name__ == "__main__":  # python tests/test_hostile_fuzz.py N: N examples per fuzzer (scripts/fuzz.py has options)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    run_campaign({name: n for name in FUZZERS})
