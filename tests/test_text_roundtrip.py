"""The text form round-trips: parse(script(m)) is structurally equal to m (attributes, dtypes
and constants included), on hypothesis-generated modules and on hand-written ones covering
every op; save/load round-trips modules with large constants through the .npz sidecar."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpl
from dpl.errors import DplError
from dpl.ir import FunctionBuilder, Module, const, structural_equal
from dpl.ops import all_ops

EXAMPLES = sorted((Path(__file__).parent.parent / "examples").glob("*.ir"))


def roundtrip(mod):
    text = mod.script()
    back = dpl.parse(text)
    assert structural_equal(back, mod), text
    assert back.script() == text
    return text


class RandomModule:
    """A random, well-typed module: the ops, attributes and constants a generator can reach."""

    FLOAT_UNARY = ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "negative", "abs", "square",
                   "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu"]
    BINARY = ["add", "subtract", "multiply", "divide", "power", "maximum", "minimum"]
    COMPARE = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def scalar(self, dtype):
        r = self.rng
        if dtype == "bool":
            return const(bool(r.integers(2)), "bool")
        if dtype.startswith(("int", "i")):
            return const(int(r.integers(-5, 6)), dtype)
        return const(self.pick([0.5, -1.25, 1e-6, 3.0, float(r.standard_normal()), -0.0, 2.0 ** -20]), dtype)

    def build(self) -> Module:
        r = self.rng
        functions = []
        helper = None
        if r.random() < 0.4:
            helper = self.function("helper", symbolic=False, attrs=self.attrs(), n_ops=int(r.integers(1, 5)))
            functions.append(helper)
        main = self.function("main", symbolic=r.random() < 0.5, attrs={}, n_ops=int(r.integers(1, 12)), helper=helper)
        functions.append(main)
        return Module(functions)

    def attrs(self):
        r = self.rng
        out = {}
        if r.random() < 0.6:
            out["Primitive"] = True
        if r.random() < 0.5:
            out["Composite"] = self.pick(["cublas.matmul_bias", "kernel.swiglu", "x.y"])
        if r.random() < 0.3:
            out["Codegen"] = "cublas"
            out["global_symbol"] = "fused_x_cublas"
        if r.random() < 0.3:
            out["note"] = self.pick([3, -2.5, "a \"quoted\" string", [1, 2, 3], False, ["a", 1]])
        return out

    def function(self, name, symbolic, attrs, n_ops, helper=None):
        r = self.rng
        fb = FunctionBuilder(name, attrs=attrs)
        rows = "n" if symbolic else int(r.integers(1, 5))
        cols = int(self.pick([2, 4, 6]))
        dtype = self.pick(["f32", "f32", "f16"])
        pool = [fb.param("x", dtype, (rows, cols))]
        if r.random() < 0.5:
            pool.append(fb.param("y", dtype, (rows, cols)))
        if helper is not None:
            args = [fb.param(f"h_in{i}", p.ty.dtype, p.ty.shape) for i, p in enumerate(helper.params)]
            res = fb.call(helper, *args)
            if isinstance(res.ty, dpl.TupleType):
                pool.append(fb.item(res, int(r.integers(len(res.ty.fields)))))
            else:
                pool.append(res)
        for _ in range(n_ops):
            try:
                v = self.op(fb, pool)
            except DplError:
                continue  # an op this pool cannot feed: try another
            if v is not None:
                pool.append(v)
        outs = [pool[-1]] if r.random() < 0.6 else [pool[-1], pool[int(r.integers(len(pool)))]]
        if len(outs) == 2 and outs[0] is outs[1]:
            outs = outs[:1]
        return fb.ret(*outs)

    def op(self, fb, pool):
        r = self.rng
        x = self.pick(pool)
        t = x.ty
        if not isinstance(t, dpl.TensorType):
            return None
        kind = self.pick(["unary", "binary", "binary_const", "reduce", "shape", "cast", "compare", "tensor_const",
                          "nn", "concat", "split", "slice", "matmul", "clip", "create", "take", "triangle"])
        is_float = t.dtype.startswith("float")
        if kind == "unary" and is_float:
            return fb.emit(self.pick(self.FLOAT_UNARY), x)
        if kind == "binary":
            partners = [p for p in pool if p.ty == t]
            return fb.emit(self.pick(self.BINARY), x, self.pick(partners))
        if kind == "binary_const":
            return fb.emit(self.pick(self.BINARY), x, self.scalar(t.dtype))
        if kind == "reduce" and t.ndim:
            axes = sorted({int(a) for a in r.integers(-t.ndim, t.ndim, size=int(r.integers(1, t.ndim + 1)))}, key=lambda a: a % t.ndim)
            if len({a % t.ndim for a in axes}) != len(axes):
                return None
            return fb.emit(self.pick(["sum", "mean", "max", "min", "prod", "variance"]), x, axis=axes, keepdims=bool(r.integers(2)))
        if kind == "shape":
            choice = self.pick(["reshape", "permute", "expand", "squeeze", "broadcast"])
            if choice == "reshape":
                return fb.emit("reshape", x, shape=[-1] if t.is_static else list(t.shape))
            if choice == "permute":
                return fb.emit("permute_dims", x, axes=[int(a) for a in r.permutation(t.ndim)] if r.random() < 0.7 else None)
            if choice == "expand":
                return fb.emit("expand_dims", x, axis=[int(r.integers(-t.ndim - 1, t.ndim + 1))])
            if choice == "squeeze":
                return fb.emit("squeeze", fb.emit("expand_dims", x, axis=[0]), axis=[0] if r.random() < 0.5 else None)
            return fb.emit("broadcast_to", x, shape=[2, *t.shape])
        if kind == "cast":
            return fb.emit("astype", x, dtype=self.pick(["f32", "f16", "i32", "i64", "bool", "bf16"]))
        if kind == "compare":
            c = fb.emit(self.pick(self.COMPARE), x, self.scalar(t.dtype))
            return fb.emit("where", c, x, self.scalar(t.dtype)) if r.random() < 0.5 else c
        if kind == "tensor_const" and t.is_static:
            value = r.standard_normal(t.shape[-1:]).astype(dpl.dtypes.to_numpy(t.dtype))
            return fb.emit(self.pick(self.BINARY), x, const(value, name=self.pick([None, "w", "bias"])))
        if kind == "nn" and is_float and t.ndim:
            choice = self.pick(["softmax", "log_softmax", "rms_norm", "layer_norm"])
            if choice in ("softmax", "log_softmax"):
                return fb.emit(f"nn.{choice}", x, axis=int(r.integers(-t.ndim, t.ndim)))
            w = const(r.standard_normal(t.shape[-1:]).astype(dpl.dtypes.to_numpy(t.dtype))) if t.is_static or isinstance(t.shape[-1], int) else None
            if w is None:
                return None
            if choice == "rms_norm":
                return fb.emit("nn.rms_norm", x, w, epsilon=float(self.pick([1e-5, 1e-6])))
            return fb.emit("nn.layer_norm", x, w, w, epsilon=1e-5, center=bool(r.integers(2)), scale=bool(r.integers(2)))
        if kind == "concat":
            partners = [p for p in pool if p.ty == t]
            return fb.emit("concat", (x, self.pick(partners)), axis=int(r.integers(-t.ndim, t.ndim)) if t.ndim else 0)
        if kind == "split" and t.ndim and isinstance(t.shape[-1], int) and t.shape[-1] % 2 == 0:
            parts = fb.emit("split", x, indices_or_sections=2, axis=-1)
            return fb.item(parts, int(r.integers(2)))
        if kind == "slice" and t.ndim and isinstance(t.shape[-1], int):
            n = t.shape[-1]
            return fb.emit("strided_slice", x, axes=[-1], begin=[int(r.integers(0, n))], end=[n], strides=[int(r.integers(1, 3))] if r.random() < 0.5 else None)
        if kind == "matmul" and t.ndim == 2 and isinstance(t.shape[1], int):
            w = fb.emit("permute_dims", x) if t.is_static else const(np.ones((t.shape[1], 3), dpl.dtypes.to_numpy(t.dtype)))
            return fb.emit("matmul", x, w)
        if kind == "clip" and is_float:
            return fb.emit("clip", x, min=-1.0, max=float(r.random()))
        if kind == "create":
            choice = self.pick(["zeros", "ones", "full", "arange"])
            shape = [int(d) for d in r.integers(1, 4, size=2)]
            if choice == "arange":
                return fb.emit("arange", end=t.shape[0] if t.shape and isinstance(t.shape[0], str) else int(r.integers(1, 6)))
            if choice == "full":
                return fb.emit("full", self.scalar(t.dtype), shape=shape, dtype=self.pick([None, "f32"]))
            return fb.emit(choice, shape=shape, dtype=self.pick(["f32", "f16", "i64"]))
        if kind == "triangle" and t.ndim >= 2:
            return fb.emit(self.pick(["triu", "tril"]), x, k=int(r.integers(-2, 3)))
        if kind == "take" and t.ndim:
            idx = const(r.integers(0, 1, size=(2,)), "i64")
            return fb.emit("take", x, idx, axis=int(r.integers(0, t.ndim)) if r.random() < 0.7 else None)
        return None


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_random_modules_round_trip(seed):
    roundtrip(RandomModule(seed).build())


def every_op_module():
    """One call of every registered op (with non-default attributes where it has any)."""
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 8))
    sq = fb.param("sq", "f32", (8, 8))
    img = fb.param("img", "f16", (1, 4, 9, 9))
    k = fb.param("k", "f16", (4, 2, 3, 3))
    calls = {
        "add": ("add", x, x), "subtract": ("subtract", x, 1.5), "multiply": ("multiply", x, x), "divide": ("divide", x, 2.0),
        "power": ("power", x, 3.0), "maximum": ("maximum", x, 0.0), "minimum": ("minimum", sq, sq),
    }
    for name, (op, *args) in calls.items():
        fb.emit(op, *args, name=f"v_{name}")
    for op in ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal"]:
        fb.emit(op, x, 0.25, name=f"v_{op}")
    for op in ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "negative", "abs", "square",
               "nn.relu", "nn.gelu", "nn.gelu_tanh", "nn.silu"]:
        fb.emit(op, x, name="v_" + op.replace(".", "_"))
    fb.emit("clip", x, min=-1.0, max=6.0, name="v_clip")
    fb.emit("astype", x, dtype="bf16", name="v_astype")
    c = fb.emit("less", x, 0.0, name="v_cond")
    fb.emit("where", c, x, -1.0, name="v_where")
    fb.emit("matmul", x, sq, out_dtype="f16", name="v_matmul")
    fb.emit("nn.softmax", x, axis=0, name="v_softmax")
    fb.emit("nn.log_softmax", x, name="v_log_softmax")
    fb.emit("nn.rms_norm", x, const(np.linspace(0, 1, 8, dtype=np.float32)), axes=[1], epsilon=1e-6, name="v_rms_norm")
    g = const(np.ones(8, np.float32), name="gamma")
    fb.emit("nn.layer_norm", x, g, g, epsilon=1e-3, center=False, name="v_layer_norm")
    fb.emit("nn.conv2d", img, k, strides=[2, 2], padding=[1, 1, 0, 0], dilation=1, groups=2, out_dtype="f32", name="v_conv2d")
    seq = fb.emit("reshape", img, shape=[1, 4, 81], name="v_seq")
    fb.emit("nn.conv1d", seq, fb.param("k1", "f16", (2, 4, 3)), strides=[2], padding=[1, 0], name="v_conv1d")
    vol = fb.emit("reshape", img, shape=[1, 4, 9, 9, 1], name="v_vol")
    fb.emit("nn.conv3d", vol, fb.param("k3", "f16", (2, 4, 3, 3, 1)), name="v_conv3d")
    fb.emit("nn.conv1d_transpose", seq, fb.param("kt1", "f16", (4, 2, 3)), strides=[2], output_padding=[1],
            name="v_conv1d_transpose")
    fb.emit("nn.conv2d_transpose", img, k, strides=[2, 2], groups=2, name="v_conv2d_transpose")
    fb.emit("nn.conv3d_transpose", vol, fb.param("kt3", "f16", (4, 1, 2, 2, 1)), name="v_conv3d_transpose")
    fb.emit("nn.group_norm", img, const(np.ones(4, np.float16), name="gn_g"), const(np.zeros(4, np.float16), name="gn_b"),
            num_groups=2, epsilon=1e-3, name="v_group_norm")
    fb.emit("image.resize", img, size=[18, 5], method="cubic", coordinate_transformation_mode="align_corners",
            cubic_alpha=-0.5, name="v_resize")
    fb.emit("nn.max_pool2d", img, pool_size=3, strides=2, padding=1, ceil_mode=True, name="v_max_pool2d")
    fb.emit("nn.avg_pool2d", img, pool_size=[3, 2], strides=2, padding=[1, 0], dilation=[1, 2], ceil_mode=True,
            count_include_pad=True, name="v_avg_pool2d")
    fb.emit("nn.adaptive_avg_pool2d", img, output_size=[3, 4], name="v_adaptive_avg_pool2d")
    fb.emit("nn.adaptive_avg_pool2d", img, name="v_adaptive_same")
    for op in ["sum", "prod", "max", "min", "mean", "variance"]:
        fb.emit(op, x, axis=[-1], keepdims=True, name=f"v_{op}")
    fb.emit("sum", x, name="v_sum_all")
    fb.emit("reshape", x, shape=["n", 2, 4], name="v_reshape")
    fb.emit("permute_dims", x, axes=[1, 0], name="v_permute_dims")
    fb.emit("concat", (x, x), axis=1, name="v_concat")
    parts = fb.emit("split", sq, indices_or_sections=[2, 5], axis=1, name="v_split")
    fb.item(parts, 2, name="v_part")
    fb.emit("strided_slice", sq, axes=[0, 1], begin=[1, 0], end=[7, 8], strides=[2, 3], name="v_strided_slice")
    fb.emit("strided_slice", x, axes=[0, 1], begin=[-2, 0], end=[2**63 - 1, 4], name="v_slice_last_rows")
    fb.emit("strided_slice", sq, axes=[0], begin=[0], end=["n"], name="v_slice_to_symbolic_end")
    fb.emit("take", sq, const(np.array([[0, 7], [3, 3]], np.int64), name="idx"), axis=1, name="v_take")
    fb.emit("broadcast_to", x, shape=[3, "n", 8], name="v_broadcast_to")
    fb.emit("expand_dims", x, axis=[0, -1], name="v_expand_dims")
    fb.emit("squeeze", fb.emit("expand_dims", x, axis=[1], name="v_e1"), axis=[1], name="v_squeeze")
    fb.emit("full", const(7, "i32"), shape=[2, "n"], name="v_full")
    fb.emit("zeros", shape=[3], dtype="u8", name="v_zeros")
    fb.emit("ones", shape=[1, 2], name="v_ones")
    fb.emit("zeros", shape=["n", "n"], dtype="bool", name="v_zeros_symbolic")
    fb.emit("arange", end="n", name="v_arange")
    fb.emit("arange", start=0.5, end=-2.0, step=-0.25, dtype="f16", name="v_arange_float")
    fb.emit("triu", sq, k=1, name="v_triu")
    fb.emit("cumsum", sq, axis=1, dtype="i64", name="v_cumsum")
    fb.emit("tril", fb.emit("full", const(float("-inf")), shape=["n", "n"], name="v_full_symbolic"), k=-2, name="v_tril")
    # indexing, scattering and sorting (dpl/ops/indexing.py)
    i64 = const(np.array([[1], [-2]], np.int64), name="rows")
    fb.emit("argmax", x, axis=1, keepdims=True, name="v_argmax")
    fb.emit("argmin", sq, select_last_index=True, name="v_argmin")
    fb.emit("sort", x, axis=0, descending=True, name="v_sort")
    fb.emit("topk", x, k=3, largest=False, sorted=False, name="v_topk")
    fb.emit("histc", sq, bins=5, min=-1.0, max=1.0, name="v_histc")
    fb.emit("grouped_matmul", x, fb.emit("reshape", sq, shape=[1, 8, 8], name="v_experts"),
            const(np.array([3], np.int32), name="offs"), name="v_grouped_matmul")
    fb.emit("gather_nd", sq, i64, name="v_gather_nd")
    fb.emit("gather_elements", sq, const(np.zeros((2, 8), np.int64), name="zero_rows"), axis=0, name="v_gather_elements")
    fb.emit("scatter_nd", sq, i64, fb.emit("zeros", shape=[2, 8], name="v_rows0"), reduction="max", name="v_scatter_nd")
    fb.emit("scatter_elements", sq, const(np.zeros((2, 8), np.int64), name="zero_rows2"), fb.emit("ones", shape=[2, 8], name="v_rows1"),
            axis=0, reduction="add", name="v_scatter_elements")
    fb.emit("index_put", sq, (const(np.array([0, 7], np.int64), name="ix"),), fb.emit("ones", shape=[8], name="v_row1"),
            accumulate=True, name="v_index_put")
    fb.emit("slice_scatter", x, fb.emit("strided_slice", x, axes=[1], begin=[0], end=[2], name="v_two"), axes=[1], begin=[4],
            end=[8], strides=[2], name="v_slice_scatter")
    # remainders, roundings, elementwise functions and padding
    for op in ["mod", "floor_mod"]:
        fb.emit(op, x, 1.5, name=f"v_{op}")
    for op in ["floor", "ceil", "round", "trunc", "sign", "log1p", "expm1"]:
        fb.emit(op, x, name=f"v_{op}")
    fb.emit("nn.softplus", x, beta=2.0, threshold=10.0, name="v_softplus")
    fb.emit("nn.pad", img, pad_width=[0, 0, 0, 0, 1, 2, -1, 3], pad_mode="reflect", name="v_pad")
    fb.emit("nn.pad", x, pad_width=[0, 0, 1, 1], pad_value=float("-inf"), name="v_pad_constant")
    last = fb.emit("add", x, const(float("inf")), name="v_inf")
    return Module([fb.ret(last, fb.emit("multiply", x, const(-0.0), name="v_negzero"))])


def test_every_op_round_trips():
    mod = every_op_module()
    ops = {b.value.op for b in mod["main"].bindings if isinstance(b.value, dpl.Call)}
    assert ops == set(all_ops())
    roundtrip(mod)


def test_function_attributes_and_calls_round_trip():
    inner = FunctionBuilder("fused", attrs={"Primitive": True, "Composite": "kernel.x", "Codegen": "kernel",
                                            "global_symbol": "fused_kernel", "num_input": 2, "ratio": 0.5,
                                            "tags": ["a", "b"], "flag": False, "nothing": None})
    a = inner.param("a", "f32", (4,))
    fn = inner.ret(inner.emit("exp", a), inner.emit("nn.relu", a))
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (4,))
    t = fb.call(fn, x)
    out = fb.emit("add", fb.item(t, 0), fb.item(t, 1))
    text = roundtrip(Module([fb.ret(out), fn]))  # the callee is defined after its caller
    assert '@composite("kernel.x")' in text and "@primitive" in text and '@attr(tags=["a", "b"])' in text


def test_save_and_load_with_large_constants(tmp_path):
    rng = np.random.default_rng(5)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f16", ("n", 256))
    w = const(rng.standard_normal((256, 128)).astype(np.float16), name="weight")
    b = const(rng.standard_normal(128).astype(np.float32), name="bias")
    small = const(np.array([1, 2, 3], np.int64), name="small")
    y = fb.emit("astype", fb.emit("matmul", x, w), dtype="f32")
    z = fb.emit("add", y, b)
    mod = Module([fb.ret(z, fb.emit("multiply", small, small))])
    path = tmp_path / "model.ir"
    dpl.save(mod, path)
    assert (tmp_path / "model.ir.npz").exists()
    text = path.read_text()
    assert "const weight: f16[256, 128]\n" in text and "const small: i64[3] = [1, 2, 3]" in text
    back = dpl.load(path)
    assert structural_equal(back, mod)
    with pytest.raises(DplError, match="constant 'weight' has no value"):
        dpl.parse(text)
    args = [rng.standard_normal((3, 256)).astype(np.float16)]
    np.testing.assert_array_equal(dpl.interpret(back, *args)[0], dpl.interpret(mod, *args)[0])


def test_long_dtype_names_are_accepted():
    mod = dpl.parse("func main(x: float32[2], h: float16[2]) -> float32[2] {\n  y = astype(h, dtype=float32)\n  z = add(x, y)\n  return z\n}")
    assert "f32[2]" in mod.script() and "dtype=f32" in mod.script()


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_examples_parse_print_and_run(example):
    mod = dpl.load(example)
    roundtrip(mod)
    for command in (["print"], ["run", "--seed", "3"]):
        r = subprocess.run([sys.executable, "-m", "dpl", *command, str(example)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
    assert "checksum" in r.stdout


def test_cli_errors_and_internal_failures(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "dpl", *args], capture_output=True, text=True)

    for args in [("print", str(tmp_path / "missing.ir")), ("print", str(tmp_path)),
                 ("check", "nolib"), ("run", "--entry", "nope", str(EXAMPLES[0]))]:
        r = run(*args)
        assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.strip(), (args, r.stderr)
    r = run("run", "--dim", "x", str(EXAMPLES[0]))  # bad syntax of an option: a usage error
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--dim" in r.stderr, r.stderr
    binary = tmp_path / "bin.ir"
    binary.write_bytes(b"\xff\xfe\x00\x01")
    r = run("print", str(binary))
    assert r.returncode == 1 and "not a UTF-8 text file" in r.stderr
