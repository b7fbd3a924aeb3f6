"""backends/cpu/packed_gemm.py: products by constant float32 weights on weights packed once equal
the interpreter's for every shape (rows past a tile, columns past a panel, K past a K-block,
leading dims, empty dims), at one and two threads, with NaN and infinities; the CPU backend
uses the routine only where the choice says so and the product qualifies, and a model built
with it computes the interpreter's numbers."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import needs

import dpl
from dpl.backends.cpu import packed_gemm
from dpl.ir import FunctionBuilder, Module
from dpl.ir.builder import const


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    from dpl.backends.cpu.backend import KernelCache

    needs.c_compiler()
    return packed_gemm.Routine(KernelCache(tmp_path_factory.mktemp("kernels")).load(packed_gemm.SOURCE))


def product(lead, k, n, seed=0, special=(), right="constant"):
    """``main(x) = matmul(x, w)``, the module and its arguments: ``w`` a random constant
    (``right="constant"``), a parameter of shape (k, n) (``"matrix"``) or one with ``x``'s
    batch dims (``"batched"``)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((*(lead[:-1] if right == "batched" else ()), k, n)).astype(np.float32)
    x = rng.standard_normal((*lead, k)).astype(np.float32)
    for where, value in special:
        target = w if where % 2 else x
        if target.size:
            target.flat[where % target.size] = value
    fb = FunctionBuilder("main")
    xv = fb.param("x", "f32", (*lead, k))
    if right == "constant":
        return Module([fb.ret(fb.emit("matmul", xv, const(w)))]), (x,)
    wv = fb.param("w", "f32", w.shape)
    return Module([fb.ret(fb.emit("matmul", xv, wv))]), (x, w)


@st.composite
def shapes(draw):
    lead = draw(st.sampled_from([(), (1,), (2,), (2, 3)]))
    rows = draw(st.integers(0, 20))
    return (*lead, rows), draw(st.integers(0, 1100)), draw(st.integers(1, 200))  # K-blocks of 512


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shapes(), st.sampled_from([1, 2]), st.integers(0, 2**31),
       st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from([np.nan, np.inf, -np.inf])), max_size=2),
       st.sampled_from(["constant", "matrix", "batched"]))
def test_the_routine_equals_the_interpreter(lib, shape, threads, seed, special, right):
    lead, k, n = shape
    mod, args = product(lead, k, n, seed, special, right)
    call = mod["main"].bindings[0].value
    want = dpl.interpret(mod, *args)
    run = packed_gemm.runner(call, lib, threads)
    got = np.full(want.shape, 7.0, np.float32)
    w = call.args[1].value if right == "constant" else args[1]
    for _ in range(2):  # the second call reuses the scratch the first packed into
        assert run(args[0], w, got) is got
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, k ** 0.5))  # NaN where NaN, inf where inf


def test_a_non_contiguous_output_is_written_through_a_copy(lib):
    mod, (x,) = product((9,), 300, 70)
    call = mod["main"].bindings[0].value
    out = np.zeros((70, 9), np.float32).T  # the output's shape, Fortran order
    packed_gemm.runner(call, lib)(x, None, out)
    np.testing.assert_allclose(out, dpl.interpret(mod, x), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("lead, k, n, dtype, takes", [
    ((128,), 256, 512, "f32", True),
    ((1, 128), 256, 512, "f32", True),
    ((128,), 256, 512, "f64", False),   # float32 only
    ((1,), 256, 256, "f32", True),      # small: a few us more than the BLAS, but one thread pool
    ((512,), 256, 77, "f32", True),     # a narrow last panel: 3 of its last 16-wide vector padded
    ((4096,), 256, 8, "f32", False),    # 8 of 16 padded
])
def test_takes_large_wide_float32_products_by_constants(lead, k, n, dtype, takes):
    fb = FunctionBuilder("main")
    x = fb.param("x", dtype, (*lead, k))
    w = np.ones((k, n), np.float32 if dtype == "f32" else np.float64)
    fb.ret(fb.emit("matmul", x, const(w)))
    assert packed_gemm.takes(fb.bindings[0].value) is takes


@pytest.mark.parametrize("a, b, takes", [
    ((256, 256), (256, 256), True),            # packed at each call
    ((4, 128, 64), (4, 64, 128), True),        # attention's scores: the batches in turn
    ((4, 128, 64), (64, 128), True),           # one matrix for every batch
    ((4, 128, 64), (1, 64, 128), True),        # one of b's matrices for every batch of a's
    ((1, 2, 2, 128, 64), (1, 2, 1, 64, 128), True),  # grouped-query attention: b's for a run of a's
    ((4, 1, 8, 4), (1, 3, 4, 8), False),       # a's broadcast too: the provider's
    (("n", 256), (256, 256), False),           # a symbolic dim: the scratch's size is unknown
])
def test_takes_products_of_two_tensors_of_static_shapes(a, b, takes):
    fb = FunctionBuilder("main")
    x, w = fb.param("x", "f32", a), fb.param("w", "f32", b)
    fb.ret(fb.emit("matmul", x, w))
    assert packed_gemm.takes(fb.bindings[0].value) is takes


@pytest.mark.parametrize("products, packed", [("dpl", True), ("numpy", False)])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_model_built_with_the_packed_routine_equals_the_interpreter(tmp_path, monkeypatch, products, packed, threads):
    needs.c_compiler()
    from dpl.backends.cpu.backend import CpuBackend

    calls = []
    real = packed_gemm.runner

    def counted(call, lib, threads=None, **epilogue):
        run = real(call, lib, threads, **epilogue)
        return lambda a, w, *rest: calls.append(call.args[1].ty.shape) or run(a, w, *rest)

    monkeypatch.setattr(packed_gemm, "runner", counted)

    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((256, 512)) / 16).astype(np.float32)
    b1 = rng.standard_normal(512).astype(np.float32)
    w2 = (rng.standard_normal((512, 256)) / 16).astype(np.float32)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (1, 128, 256))
    h = fb.emit("nn.gelu", fb.emit("add", fb.emit("matmul", x, const(w1)), const(b1)))
    mod = Module([fb.ret(fb.emit("add", fb.emit("matmul", h, const(w2)), x))])
    fused = dpl.apply(mod, ["cublas"])
    cpu = CpuBackend(cache_dir=tmp_path / "kernels", products=products)
    exe = dpl.build(fused, [cpu, "numpy"], threads=threads, progress=False)
    xs = rng.standard_normal((1, 128, 256)).astype(np.float32)
    np.testing.assert_allclose(exe(xs), dpl.interpret(mod, xs), rtol=1e-4, atol=1e-4)
    assert not exe.fallbacks
    assert ("packed-weight routine" in exe.summary()) is packed
    assert sorted(set(calls)) == ([(256, 512), (512, 256)] if packed else [])  # both products ran by it


def test_weights_are_packed_once_at_the_first_call_for_every_thread_cap(lib, monkeypatch):
    packs = []
    real = packed_gemm.Routine.pack
    monkeypatch.setattr(packed_gemm.Routine, "pack", lambda self, w: packs.append(w.shape) or real(self, w))
    mod, (x,) = product((64,), 300, 128)
    call = mod["main"].bindings[0].value
    one = packed_gemm.runner(call, lib, 1)
    two = one.with_threads(2)
    assert two is not one and two.threads == 2 and packs == []  # a build packs nothing
    want = dpl.interpret(mod, x)
    for run in (two, one, two):
        out = np.empty_like(want)
        np.testing.assert_allclose(run(x, call.args[1].value, out), want, rtol=1e-4, atol=1e-3)
    assert packs == [(300, 128)]


@pytest.mark.parametrize("kernel, strides, padding, groups", [(1, 1, 0, 1), (3, 2, 1, 1), (3, 1, 1, 2)])
def test_convolutions_as_im2col_and_the_routine_equal_the_interpreter(tmp_path, monkeypatch, kernel, strides, padding, groups):
    """products="dpl": a float32 convolution with one group is im2col's columns times the
    weights by the routine (columns read in place); a grouped one stays the BLAS's."""
    needs.c_compiler()
    from dpl.backends.cpu.backend import CpuBackend

    used = []
    real = packed_gemm.array_matmul

    def counted(lib_, fallback, threads=None):
        run = real(lib_, fallback, threads)
        return lambda a, b, out: used.append((a.flags.c_contiguous and b.flags.c_contiguous, b.shape)) or run(a, b, out)

    monkeypatch.setattr(packed_gemm, "array_matmul", counted)
    rng = np.random.default_rng(kernel + groups)
    w = rng.standard_normal((8, 6 // groups, kernel, kernel)).astype(np.float32)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (2, 6, 13, 11))
    y = fb.emit("nn.conv2d", x, const(w), strides=[strides, strides], padding=[padding] * 4, groups=groups)
    mod = Module([fb.ret(fb.emit("nn.relu", y))])
    exe = dpl.build(mod, [CpuBackend(cache_dir=tmp_path / "kernels", products="dpl"), "numpy"],
                    config=dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0), progress=False)
    xs = rng.standard_normal((2, 6, 13, 11)).astype(np.float32)
    xs[0, 0, 0, 0] = np.nan
    np.testing.assert_allclose(exe(xs), dpl.interpret(mod, xs), rtol=1e-4, atol=1e-4)
    assert not exe.fallbacks
    assert bool(used) == (groups == 1) and all(whole for whole, _ in used)


def test_array_matmul_leaves_other_operands_to_its_fallback(lib):
    calls = []
    run = packed_gemm.array_matmul(lib, lambda a, b, out: calls.append(a.dtype) or np.matmul(a, b, out=out))
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        a, b = rng.standard_normal((5, 7)).astype(dtype), rng.standard_normal((3, 7, 40)).astype(dtype)
        out = np.empty((3, 5, 40), dtype)
        np.testing.assert_allclose(run(a, b, out), a @ b, rtol=1e-5, atol=1e-5)
    assert calls == [np.float64]


def test_a_transposed_constant_is_packed_from_its_values(lib):
    """An ONNX Gemm's transB leaves a Fortran-order constant: packed from a C copy, held while
    the routine reads it (a copy freed before the call gave garbage on BERT's pooler)."""
    from dpl.ir.expr import Call, Constant, Var
    from dpl.ir.types import TensorType

    rng = np.random.default_rng(7)
    w = np.asfortranarray(rng.standard_normal((300, 200)).astype(np.float32))
    call = Call("matmul", (Var("a", TensorType((5, 300), "float32")), Constant(w)), {}, TensorType((5, 200), "float32"))
    x = rng.standard_normal((5, 300)).astype(np.float32)
    out = np.empty((5, 200), np.float32)
    np.testing.assert_allclose(packed_gemm.runner(call, lib)(x, w, out), x @ w, rtol=1e-4, atol=1e-3)


def test_a_routine_that_does_not_compile_leaves_the_products_to_the_provider(tmp_path, monkeypatch):
    needs.c_compiler()
    from dpl.backends.cpu.backend import CpuBackend, KernelCache
    from dpl.backends.registry import CompileError

    real = KernelCache.load

    def refuse(self, source):
        if packed_gemm.SOURCE in source:  # the routine, with or without the vector exp declared
            raise CompileError("no vectors here")
        return real(self, source)

    monkeypatch.setattr(KernelCache, "load", refuse)
    mod, (x,) = product((1, 64), 128, 96)
    cpu = CpuBackend(cache_dir=tmp_path / "kernels", products="dpl")
    exe = dpl.build(dpl.apply(mod, ["cublas"]), [cpu, "numpy"], progress=False)
    np.testing.assert_allclose(exe(x), dpl.interpret(mod, x), rtol=1e-4, atol=1e-4)
    assert not exe.fallbacks and cpu._routine() is None


def folded_and_apart(monkeypatch, tmp_path, fused, threads=None):
    """``fused`` built for the CPU with dpl's packed products, twice: as the backend folds the
    products' epilogues, and with nothing folded; and the kinds of the epilogue steps the first
    build folded, in order."""
    from dpl.backends.cpu import backend as cpu_backend
    from dpl.backends.cpu import segments
    from dpl.backends.cpu.backend import CpuBackend

    seen = []
    real = segments.fold_epilogues

    def spy(steps, folds, results, **kw):
        out = real(steps, folds, results, **kw)
        seen.extend(e[0] for s in out if isinstance(s, segments.Product) for e in s.epilogue)
        return out

    def build():
        config = dpl.FusionConfig(fallback_on_error=False)
        return dpl.build(fused, [CpuBackend(cache_dir=tmp_path, products="dpl"), "numpy"], threads=threads, config=config,
                         progress=False)

    monkeypatch.setattr(cpu_backend, "fold_epilogues", spy)
    folded = build()
    monkeypatch.setattr(cpu_backend, "fold_epilogues", lambda steps, folds, results, **kw: steps)
    return folded, build(), seen


EPILOGUES = {
    # name: (the adds after the product, in order, as (kind, operand)), what the product takes
    "bias then residual": ([("bias", (100,)), ("res", None)], ["bias", "residual"]),
    "bias of [1, N]": ([("bias", (1, 100)), ("res", None)], []),  # cublas's patterns take a bias of [N]: a group apart
    "residual only": ([("res", None)], ["residual"]),
    "bias only": ([("bias", (100,))], ["bias"]),
    "residual then bias": ([("res", None), ("bias", (100,))], ["residual"]),  # the bias stays a part
    "the biased value is a result too": ([("bias", (100,)), ("res", None)], ["bias"]),
    "the product is a result too": ([("bias", (100,))], []),
    "bias then gelu": ([("bias", (100,)), ("act", "nn.gelu")], ["bias", "act"]),
    # cublas.matmul_bias_residual ends at the residual: the relu is a group of its own
    "bias, residual, relu": ([("bias", (100,)), ("res", None), ("act", "nn.relu")], ["bias", "residual"]),
    "gelu_tanh alone": ([("act", "nn.gelu_tanh")], ["act"]),
    "bias then tanh": ([("bias", (100,)), ("act", "tanh")], ["bias", "act"]),
    "bias then silu": ([("bias", (100,)), ("act", "nn.silu")], ["bias", "act"]),
    "relu then bias": ([("act", "nn.relu"), ("bias", (100,))], ["act"]),  # the bias stays a part
    "exp is no activation here": ([("bias", (100,)), ("act", "exp")], ["bias"]),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(EPILOGUES))
def test_bias_and_residual_adds_fold_into_the_product_bit_for_bit(tmp_path, monkeypatch, case, threads):
    """A weight's product followed by a bias add, a residual add and an activation stores them
    with its tiles (segments.fold_epilogues): the same bits as the product and the rest run
    apart (the activations are the generated kernels' own expressions), at 517 x 600
    by 600 x 100 (two K-blocks, a narrow last panel, a ragged last row block), nothing folded
    where a value the adds consume is read elsewhere."""
    needs.c_compiler()

    adds, folded = EPILOGUES[case]
    rng = np.random.default_rng(len(case))
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (517, 600))
    r = fb.param("r", "f32", (517, 100))
    y = fb.emit("matmul", x, const((rng.standard_normal((600, 100)) / 16).astype(np.float32)))
    values = [y]
    for kind, shape in adds:
        if kind == "act":
            values.append(fb.emit(shape, values[-1]))
            continue
        values.append(fb.emit("add", values[-1], const(rng.standard_normal(shape).astype(np.float32)) if kind == "bias" else r))
    rets = {"the biased value is a result too": (values[-1], values[1]), "the product is a result too": (values[-1], y)}
    mod = Module([fb.ret(*rets.get(case, (values[-1],)))])
    args = [rng.standard_normal((517, 600)).astype(np.float32), rng.standard_normal((517, 100)).astype(np.float32)]

    exe, apart, seen = folded_and_apart(monkeypatch, tmp_path, dpl.apply(mod, ["cublas"]), threads)
    got = exe(*args)
    assert seen == folded
    for g, a, w in zip(*(v if isinstance(v, tuple) else (v,) for v in (got, apart(*args), dpl.interpret(mod, *args)))):
        np.testing.assert_array_equal(g, a)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


GLUS = {
    # name: (rows, K, F, gate first, silu(gate) * up written up * silu(gate), what folds)
    "one K-block": ((3, 37), 256, 128, True, False, ["glu"]),
    "two K-blocks": ((101,), 600, 64, True, False, ["glu"]),
    "gate second, up times silu": ((64,), 96, 192, False, True, ["glu"]),
    "a half of no whole panels": ((64,), 96, 96, True, False, []),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(GLUS))
def test_the_gated_unit_folds_into_the_product_bit_for_bit(tmp_path, monkeypatch, case, threads):
    """A gated MLP's merged product, its halves, silu of the gate times the up projection
    (segments.fold_epilogues' gated unit): the routine computes silu(gate) * up on the pairs of
    tiles it accumulates (one K-block) or stores (more), never writing the product's 2F
    columns, with the same bits as the product and the generated C run apart; ragged row
    blocks, batch dims and both orders of the halves."""
    needs.c_compiler()

    rows, k, f, gate_first, up_first, folded = GLUS[case]
    rng = np.random.default_rng(k + f)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (*rows, k))
    y = fb.emit("matmul", x, const((rng.standard_normal((k, 2 * f)) / 8).astype(np.float32)))
    axis = len(rows)
    first = fb.emit("strided_slice", y, axes=[axis], begin=[0], end=[f], strides=[1])
    second = fb.emit("strided_slice", y, axes=[axis], begin=[f], end=[2 * f], strides=[1])
    gate, up = (first, second) if gate_first else (second, first)
    act = fb.emit("nn.silu", gate)
    out = fb.emit("multiply", *((up, act) if up_first else (act, up)))
    mod = Module([fb.ret(out)])
    arg = (rng.standard_normal((*rows, k)) * 2).astype(np.float32)
    arg.reshape(-1, k)[0] *= 200  # a row of gates far past exp's range either way: exp(-g) is 0 or inf

    exe, apart, seen = folded_and_apart(monkeypatch, tmp_path, dpl.apply(mod, ["llm", "cublas"]), threads)
    got = exe(arg)
    assert seen == folded
    np.testing.assert_array_equal(got, apart(arg))
    np.testing.assert_allclose(got, dpl.interpret(mod, arg), rtol=1e-4, atol=1e-4)


def test_the_gated_unit_without_the_routine_runs_on_numpy():
    """The segment runner's own path for a folded gated unit (the routine failed after the
    plan): NumPy's product, then silu(gate) * up, equal to the interpreter."""
    from dpl.backends.cpu import segments

    rng = np.random.default_rng(5)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (9, 32))
    y = fb.emit("matmul", x, const(rng.standard_normal((32, 128)).astype(np.float32)))
    up = fb.emit("strided_slice", y, axes=[1], begin=[0], end=[64], strides=[1])
    gate = fb.emit("strided_slice", y, axes=[1], begin=[64], end=[128], strides=[1])
    out = fb.emit("multiply", fb.emit("nn.silu", gate), up)
    fn = Module([fb.ret(out)])["main"]
    steps = segments.fold_epilogues(segments.segment(fn), lambda p: True, [fn.ret], glu=lambda p: True)
    assert [type(s).__name__ for s in steps] == ["Product"] and steps[0].epilogue == (("glu", False),)
    run = segments.segment_runner(fn, steps, [], np)
    arg = rng.standard_normal((9, 32)).astype(np.float32)
    result = np.empty((9, 64), np.float32)
    run([arg], [result])
    np.testing.assert_allclose(result, dpl.interpret(Module([fn]), arg), rtol=1e-5, atol=1e-5)


def test_an_activation_after_the_residual_folds_and_runs_on_numpy_without_the_routine():
    """fold_epilogues on a group the patterns do not make (bias, residual, then relu in one
    part): the three fold, nothing is left of the part, and the segment runner's own path
    (NumPy's product, then the epilogue) equals the interpreter."""
    from dpl.backends.cpu import segments

    rng = np.random.default_rng(11)
    fb = FunctionBuilder("main")
    x, r = fb.param("x", "f32", (7, 24)), fb.param("r", "f32", (7, 40))
    y = fb.emit("matmul", x, const(rng.standard_normal((24, 40)).astype(np.float32)))
    y = fb.emit("add", y, const(rng.standard_normal(40).astype(np.float32)))
    out = fb.emit("nn.relu", fb.emit("add", r, y))
    fn = Module([fb.ret(out)])["main"]
    steps = segments.fold_epilogues(segments.segment(fn), lambda p: True, [fn.ret], acts=("nn.relu",))
    assert [type(s).__name__ for s in steps] == ["Product"]
    assert [e[0] for e in steps[0].epilogue] == ["bias", "residual", "act"]
    args = [rng.standard_normal((7, 24)).astype(np.float32), rng.standard_normal((7, 40)).astype(np.float32)]
    result = np.empty((7, 40), np.float32)
    segments.segment_runner(fn, steps, [], np)(args, [result])
    np.testing.assert_allclose(result, dpl.interpret(Module([fn]), *args), rtol=1e-5, atol=1e-5)
    assert segments.fold_epilogues(segments.segment(fn), lambda p: True, [fn.ret])[0].epilogue[-1] == ("residual",)


@pytest.mark.parametrize("tail", ["residual", "gelu_tanh"])
def test_a_view_back_to_batch_and_sequence_folds_with_the_epilogue(tmp_path, monkeypatch, tail):
    """GPT-2's Conv1D: the product on 2-D rows, its bias, a view back to [batch, seq, n], then
    the residual add or the GELU: the view only regroups rows, so both fold (the patterns take
    the view into the group), bit for bit against the part run apart."""
    needs.c_compiler()
    from dpl.backends.cpu import segments

    rng = np.random.default_rng(13)
    fb = FunctionBuilder("main")
    x, r = fb.param("x", "f32", (6 * 35, 64)), fb.param("r", "f32", (6, 35, 96))
    y = fb.emit("matmul", x, const((rng.standard_normal((64, 96)) / 8).astype(np.float32)))
    y = fb.emit("reshape", fb.emit("add", y, const(rng.standard_normal(96).astype(np.float32))), shape=[6, 35, 96])
    out = fb.emit("add", y, r) if tail == "residual" else fb.emit("nn.gelu_tanh", y)
    mod = Module([fb.ret(out)])
    args = [rng.standard_normal((210, 64)).astype(np.float32), rng.standard_normal((6, 35, 96)).astype(np.float32)]
    fused = dpl.apply(mod, ["cublas"])
    exe, apart, seen = folded_and_apart(monkeypatch, tmp_path, fused)
    got = exe(*args)
    assert seen == ["bias", "residual" if tail == "residual" else "act"]
    np.testing.assert_array_equal(got, apart(*args))
    np.testing.assert_allclose(got, dpl.interpret(mod, *args), rtol=1e-4, atol=1e-4)
    # the segment runner's own NumPy path (no routine), the view folded in
    comp = next(f for f in fused.functions.values() if f.attrs.get("Composite"))
    steps = segments.fold_epilogues(segments.segment(comp), lambda p: True, [comp.ret], acts=("nn.gelu_tanh",))
    assert [type(s).__name__ for s in steps] == ["Product"]
    by_name = {"x": args[0], "r": args[1]}
    result = np.empty((6, 35, 96), np.float32)
    segments.segment_runner(comp, steps, [], np)([by_name[p.name] for p in comp.params], [result])
    np.testing.assert_allclose(result, got, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module", params=list(needs.BUILDS))
def isa_lib(request, tmp_path_factory):
    """The routine built for each of :data:`needs.BUILDS` this CPU runs, and its -march."""
    from dpl.backends.cpu.toolchain import KernelCache
    needs.c_compiler()
    march = request.param
    needs.build_runs_here(march)
    cache = KernelCache(tmp_path_factory.mktemp(f"kernels-{march}"), march=march)
    return packed_gemm.Routine(cache.load(packed_gemm.source(cache.vector_math()))), march


def test_each_build_has_its_own_register_tile(isa_lib):
    """AVX-512's tile is 64 columns (4 zmm), AVX2's 16 (2 ymm): the micro-kernel follows the
    build's instruction set, not the CPU the code was tuned on."""
    from dpl.host_cpu import isa_flags

    lib, march = isa_lib
    wide = march == "native" and "avx512f" in isa_flags()
    assert lib.panel_width == (64 if wide else 16)


@pytest.mark.parametrize("k, n", [(1, 1), (3, 17), (300, 129)])
def test_packed_panels_start_on_a_cache_line(isa_lib, k, n):
    """NumPy's arrays start 16 bytes into a line: the routine's 64-byte loads of such panels
    straddle two lines (15-20% of the products' rate on the AVX-512 Xeon)."""
    lib, _ = isa_lib
    w = np.arange(k * n, dtype=np.float32).reshape(k, n)
    for _ in range(4):  # several allocations: each its own offset
        panels = lib.pack(w)
        assert panels.ctypes.data % 64 == 0
        np.testing.assert_array_equal(panels.transpose(1, 0, 2).reshape(k, -1)[:, :n], w)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows, k, n", [
    (1, 1, 1), (7, 300, 17), (300, 64, 129), (130, 1030, 100), (6, 256, 64), (0, 5, 16),
])
@pytest.mark.parametrize("epilogue", [(), ("bias",), ("bias", "residual"), ("bias", "nn.gelu"),
                                      ("bias", "residual", "nn.silu"), ("nn.gelu_tanh",), ("nn.relu",), ("tanh",)])
def test_each_build_equals_numpy_with_its_epilogue(isa_lib, rows, k, n, epilogue, threads):
    """Each instruction set's build against NumPy: rows past a tile and past a row group (MC),
    columns past a panel, K past a K-block, empty rows, then its bias, residual and activation."""
    lib, _ = isa_lib
    rng = np.random.default_rng(rows * 1000 + k + n)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / 8).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32) if "bias" in epilogue else None
    res = rng.standard_normal((rows, n)).astype(np.float32)
    act = next((e for e in epilogue if e.startswith(("nn.", "tanh"))), None)
    fb = FunctionBuilder("main")
    xv = fb.param("x", "f32", (rows, k))
    fb.emit("matmul", xv, const(w))
    run = packed_gemm.runner(fb.bindings[0].value, lib, threads, bias=bias, residual="residual" in epilogue, act=act)
    want = x.astype(np.float64) @ w
    if bias is not None:
        want = want + bias
    if "residual" in epilogue:
        want = want + res
    if act is not None:
        want = dpl.interpret(_unary(act, want.shape), want.astype(np.float32))
    got = np.full((rows, n), 7.0, np.float32)
    run(x, w, *((res,) if "residual" in epilogue else ()), got)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, k ** 0.5))


def _unary(op, shape):
    fb = FunctionBuilder("main")
    return Module([fb.ret(fb.emit(op, fb.param("y", "f32", shape)))])


@pytest.mark.parametrize("rows, k, f, gate_first", [(13, 96, 64, True), (131, 600, 128, False), (1, 256, 64, True),
                                                     (5, 300, 64, True)])
def test_each_build_computes_the_gated_unit(isa_lib, rows, k, f, gate_first):
    """The gated unit (silu(gate) * up, the weight's gate and up panels alternating) of each
    build against NumPy: K of at most ``KC`` rows (on the stack), more (through the scratch),
    two K-blocks."""
    lib, _ = isa_lib
    if f % lib.panel_width:
        pytest.skip("the halves are not whole panels of this build")
    rng = np.random.default_rng(rows + k)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = (rng.standard_normal((k, 2 * f)) / 8).astype(np.float32)
    fb = FunctionBuilder("main")
    fb.emit("matmul", fb.param("x", "f32", (rows, k)), const(w))
    run = packed_gemm.glu_runner(fb.bindings[0].value, lib, gate_first, 2)
    y = x.astype(np.float64) @ w
    gate, up = (y[:, :f], y[:, f:]) if gate_first else (y[:, f:], y[:, :f])
    got = np.empty((rows, f), np.float32)
    run(x, w, got)
    np.testing.assert_allclose(got, gate / (1 + np.exp(-gate)) * up, rtol=1e-4, atol=1e-4 * k ** 0.5)


def test_runners_of_one_constant_share_its_panels(tmp_path):
    """A plan per bucket of sizes makes runners of its own: each product of one weight reads the
    panels packed once, for as long as the weight lives."""
    needs.c_compiler()
    import gc
    import weakref

    from dpl.backends.cpu.toolchain import KernelCache

    routine = packed_gemm.Routine(KernelCache(tmp_path).load(packed_gemm.source(True)))
    w = np.random.default_rng(0).standard_normal((32, 48)).astype(np.float32)
    first = packed_gemm.packed_weight(w, routine)
    assert packed_gemm.packed_weight(w, routine) is first and packed_gemm.packed_weight(w, routine, ("glu", True)) is not first
    panels = first.get()
    assert packed_gemm.packed_weight(w, routine).get() is panels
    ref = weakref.ref(first)
    del first, panels, w
    gc.collect()
    assert ref() is None  # the weight gone, its panels with it


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300), st.integers(1, 1100), st.integers(1, 300), st.integers(0, 2**31))
def test_every_team_size_computes_the_same_bits(lib, rows, k, n, seed):
    """The team shares (group, panel, row share) items; each element still sums its K-blocks in
    order on one thread, so one thread and two give the same bits, every row block once."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    fb = FunctionBuilder("main")
    fb.emit("matmul", fb.param("x", "f32", (rows, k)), const(w))
    call = fb.bindings[0].value
    one, two = (np.full((rows, n), np.nan, np.float32) for _ in range(2))
    packed_gemm.runner(call, lib, 1)(x, w, one)
    packed_gemm.runner(call, lib, 2)(x, w, two)
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, x.astype(np.float64) @ w, rtol=1e-4, atol=1e-4 * k ** 0.5)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("a, b", [
    ((1, 2, 3, 37, 19), (1, 2, 1, 19, 70)),  # grouped-query attention's scores: 2 key heads for 6 query heads
    ((2, 3, 1, 5, 8), (2, 1, 1, 8, 47)),     # b's ones after the prefix, a's last one too; a narrow last panel
    ((4, 9, 16), (1, 16, 100)),              # one b for every batch
])
def test_a_broadcast_right_operand_serves_each_run_of_batches(lib, a, b, threads):
    """b's matrices broadcast over a's trailing batch dims (``dims[5]``: how many of a's batches
    in a row each serves) give NumPy's broadcast product, the narrow last panel included."""
    rng = np.random.default_rng(sum(a) + sum(b))
    x, y = rng.standard_normal(a).astype(np.float32), rng.standard_normal(b).astype(np.float32)
    fb = FunctionBuilder("main")
    fb.emit("matmul", fb.param("x", "f32", a), fb.param("y", "f32", b))
    call = fb.bindings[0].value
    assert packed_gemm.takes(call)
    got = np.full(np.broadcast_shapes(a[:-2], b[:-2]) + (a[-2], b[-1]), np.nan, np.float32)
    packed_gemm.runner(call, lib, threads)(x, y, got)
    np.testing.assert_allclose(got, np.matmul(x.astype(np.float64), y), rtol=1e-5, atol=1e-5)
