"""A plan's prepared call (dpl/runtime/prepared.py: every step's C calls run in one call into C)
computes what the general path computes, bit for bit, on every plan of the runtime corpora, at
two input signatures; and keeps what a call promises: a result held is never overwritten by the
next call, an input's values are read at every call (a weight passed as an input and changed in
place), strided and read-only inputs, other shapes, threads calling at once, a thread budget
whose calls choose between two lists of steps, and plans that cannot be prepared."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import dpl
import needs
from dpl.backends.cpu.backend import CpuBackend
from dpl.backends.cpu.call_list import KERNEL, PACKED, SCRATCH
from dpl.backends.cpu.packed_gemm import ACTS, KC
from dpl.cli import random_inputs
from dpl.ir import FunctionBuilder, Module, const
from dpl.runtime.prepared import MixedCall, PreparedCall

import runtime_corpus
from test_runtime_text_corpus import MODULES as TEXT_MODULES


@pytest.fixture(scope="module", autouse=True)
def _compiler():
    needs.c_compiler()


def general(plan, flat):
    """What the general path computes: a timer sends a call there (it times each step)."""
    return plan.run(flat, None, timer=lambda step, run: run())


def bits(result) -> list[bytes]:
    return [(a.dtype.str, a.shape, a.tobytes()) for a in (result if isinstance(result, tuple) else (result,))]


def check_both_ways(exe, args) -> bool:
    """The prepared path and the general path give the same bits (twice); whether the plan was
    prepared."""
    flat = exe._flat_inputs(args)
    plan = exe.plan(*args)
    held = general(plan, flat)  # held: the next calls' outputs are other memory
    want = bits(held)
    for _ in range(2):
        poison(plan)
        assert bits(plan.run(flat)) == want
    poison(plan)
    assert bits(exe(*args)) == want  # as a user calls it, through the latest plan's shortcut
    return bool(plan._prepared)


def poison(plan) -> None:
    """Every output buffer the plan's pool keeps filled with NaN bytes, so that a result its
    steps did not write never passes for the one they would have written."""
    for buffers in plan.output_pool._buffers:
        for raw in buffers:
            raw.fill(0xFF)


def corpus():
    mods = {f"corpus_{name}": (make(), dims) for name, (make, dims) in runtime_corpus.CORPUS.items()}
    mods.update({f"text_{name}": (mod, {}) for name, mod in TEXT_MODULES.items()})
    return mods


CORPUS = corpus()


def test_every_corpus_plan_gives_the_general_paths_bits_at_two_signatures():
    prepared = []
    for name, (mod, dims) in CORPUS.items():
        # no thread choice: the general call below (a timed one) runs the steps the prepared one does
        exe = dpl.build(mod, "cpu", progress=None, adapt_threads=False)
        for n, seed in ((3, 1), (16, 2)):
            args = random_inputs(mod["main"], seed=seed, dims={"n": n, **dims})
            if check_both_ways(exe, args):
                prepared.append(name)
    # most plans of the corpus are C kernels only: the prepared path runs them
    assert len(set(prepared)) >= len(CORPUS) // 2, sorted(set(CORPUS) - set(prepared))


def linear_module(k: int = 32, n: int = 64, glu: bool = False, residual: bool = False) -> Module:
    """A model's layer as FuseOps leaves it: a product by a constant weight in a group, with
    its bias and activation (or gated unit, or residual) after it, then another kernel."""
    rng = np.random.default_rng(k + n)
    w = const((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), name="w")
    b = const(rng.standard_normal(n).astype(np.float32), name="b")
    fb = FunctionBuilder("fused_linear", attrs={"Primitive": True})
    x = fb.param("x", "f32", ("m", k))
    r = fb.param("r", "f32", ("m", n)) if residual else None
    y = fb.emit("matmul", x, w)
    if glu:
        gate = fb.emit("strided_slice", y, begin=[0], end=[n // 2], axes=[1], strides=[1])
        up = fb.emit("strided_slice", y, begin=[n // 2], end=[n], axes=[1], strides=[1])
        out = fb.emit("multiply", fb.emit("nn.silu", gate), up)
    else:
        out = fb.emit("add", y, b)
        if residual:
            out = fb.emit("add", out, r)
        out = fb.emit("nn.gelu", out)
    group = fb.ret(out)
    main = FunctionBuilder("main")
    xm = main.param("x", "f32", ("m", k))
    params = [xm, main.param("r", "f32", ("m", n))] if residual else [xm]
    h = main.call(group, *params)
    return Module([main.ret(main.emit("tanh", h)), group])


# each layer: the kind of its product's call (call_list.PACKED: a constant weight's packed
# product with its epilogue; SCRATCH: the gated unit) and the activation code it carries
LAYERS = {"bias_gelu": ({}, PACKED, ACTS.index("nn.gelu") + 1), "residual": ({"residual": True}, PACKED, ACTS.index("nn.gelu") + 1),
          "glu": ({"glu": True, "n": 128}, SCRATCH, 0), "glu_two_blocks": ({"glu": True, "n": 128, "k": 300}, SCRATCH, 0),
          "wide_k": ({"k": 300}, PACKED, ACTS.index("nn.gelu") + 1)}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_packed_products_and_their_epilogues_are_prepared(layer):
    options, kind, code = LAYERS[layer]
    mod = linear_module(**options)
    exe = dpl.build(mod, CpuBackend(products="dpl"), progress=None, threads=1)
    for m in (1, 7):
        args = runtime_corpus.inputs_for(mod, {"m": m}, seed=m)
        assert check_both_ways(exe, args), exe.summary()
        (prepared,) = exe.plan(*args)._prepared.values()
        first, *rest = prepared.calls
        assert (first.kind, first.code) == (kind, code) and [c.kind for c in rest] == [KERNEL]  # the product, then tanh
        assert first.dims[0] == m
        if kind == SCRATCH:  # the gated unit: a scratch of its own only where K takes two blocks
            assert (first.args[3] is not None) == (options.get("k", 32) > KC)


def test_a_held_result_is_never_overwritten_and_inputs_are_read_at_every_call():
    fb = FunctionBuilder("main")
    x, w = fb.param("x", "f32", (4, 16)), fb.param("w", "f32", (16, 16))
    mod = Module([fb.ret(fb.emit("nn.relu", fb.emit("matmul", x, w)))])
    exe = dpl.build(mod, CpuBackend(products="dpl"), progress=None, threads=1)
    rng = np.random.default_rng(0)
    xs, w0 = rng.standard_normal((4, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)
    w = w0.copy()
    first = exe(xs, w)
    kept = first.copy()
    assert exe.plan(xs, w)._prepared
    w *= 2  # a weight passed as an input, changed in place: the next call reads the new values
    second = exe(xs, w)
    np.testing.assert_array_equal(first, kept)  # held: not overwritten
    assert not np.shares_memory(first, second)
    np.testing.assert_array_equal(second, bits_of(general(exe.plan(xs, w), [xs, w])))
    np.testing.assert_allclose(second, 2 * kept, rtol=1e-6)
    del first, second
    third, fourth = exe(xs, w0), exe(xs, w0)  # results dropped: the pool hands their memory out again
    assert not np.shares_memory(third, fourth)
    np.testing.assert_array_equal(third, fourth)
    np.testing.assert_array_equal(third, kept)


def bits_of(result):
    return result[0] if isinstance(result, tuple) else result


def test_strided_and_read_only_inputs_and_other_shapes_in_turn():
    mod = linear_module()
    exe = dpl.build(mod, CpuBackend(products="dpl"), progress=None, threads=1)
    rng = np.random.default_rng(3)
    for m in (2, 5, 2, 9, 5):
        x = rng.standard_normal((m, 32)).astype(np.float32)
        want = bits(general(exe.plan(x), [x]))
        assert bits(exe(x)) == want
        assert bits(exe(np.asfortranarray(x))) == want  # strided: read through a contiguous copy
        wide = np.zeros((m, 64), np.float32)
        wide[:, ::2] = x
        assert bits(exe(wide[:, ::2])) == want
        frozen = x.copy()
        frozen.flags.writeable = False
        assert bits(exe(frozen)) == want
        out = np.empty((m, 64), np.float32)
        assert exe(x, out=out) is out and bits(out) == want  # out=: the general path
    assert len(exe.plans) == 3 and all(p._prepared for p in exe.plans.values())


def test_threads_calling_at_once_each_use_their_own_prepared_call():
    mod = linear_module(residual=True)
    exe = dpl.build(mod, CpuBackend(products="dpl"), progress=None, threads=1)
    rng = np.random.default_rng(4)
    cases = [[rng.standard_normal((6, 32)).astype(np.float32), rng.standard_normal((6, 64)).astype(np.float32)] for _ in range(4)]
    wants = [bits(general(exe.plan(*c), c)) for c in cases]
    errors = []
    start = threading.Barrier(len(cases))

    def worker(case, want):
        start.wait()
        for _ in range(200):
            if bits(exe(*case)) != want:
                errors.append("differs")
                return

    threads = [threading.Thread(target=worker, args=cw) for cw in zip(cases, wants)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    plan = exe.plan(*cases[0])
    assert len(plan._prepared) == len(plan._views) >= 1  # one prepared call per arena the threads held


def test_a_budget_of_two_threads_prepares_each_list_of_steps():
    mod = linear_module()
    exe = dpl.build(mod, CpuBackend(products="dpl"), progress=None, threads=2)
    x = np.random.default_rng(5).standard_normal((8, 32)).astype(np.float32)
    plan = exe.plan(x)
    want = bits(general(plan, [x]))
    for _ in range(40):  # the thread choice tries both lists before it settles
        assert bits(exe(x)) == want
    if plan.thread_choice is not None:
        lists = {key[1] for key in plan._prepared}
        assert lists <= {id(plan.steps), id(plan.single_steps)} and lists


def test_steps_that_cannot_be_prepared_run_in_python_between_prepared_ones():
    """NumPy's product (no C call to prepare) in Python, the kernel after it prepared; a plan
    with no C call at all runs the general path."""
    mod = linear_module()
    exe = dpl.build(mod, CpuBackend(products="numpy"), progress=None, threads=1)
    x = np.random.default_rng(6).standard_normal((3, 32)).astype(np.float32)
    assert bits(exe(x)) == bits(general(exe.plan(x), [x]))
    plan = exe.plan(x)
    (mixed,) = plan._prepared.values()
    assert isinstance(mixed, MixedCall)
    in_python = [p for p in mixed.parts if not isinstance(p, PreparedCall)]
    assert in_python and all(p in plan.steps for p in in_python) and len(in_python) < len(mixed.parts)
    for seed in range(3):  # the arena's temporaries the Python steps write, the prepared runs read
        x = np.random.default_rng(seed).standard_normal((3, 32)).astype(np.float32)
        assert bits(exe(x)) == bits(general(plan, [x]))
    numpy_exe = dpl.build(mod, "numpy", progress=None)
    assert bits(numpy_exe(x)) == bits(general(numpy_exe.plan(x), [x])) and not numpy_exe.plan(x)._prepared


def test_a_kernel_capped_at_one_thread_leaves_the_callers_openmp_setting_as_it_was():
    import ctypes

    try:
        gomp = ctypes.CDLL("libgomp.so.1")
    except OSError:
        pytest.skip("no libgomp.so.1 to ask")
    mod = linear_module()
    exe = dpl.build(mod, CpuBackend(products="dpl"), progress=None, threads=1)  # every OpenMP kernel capped at one thread
    x = np.random.default_rng(7).standard_normal((3, 32)).astype(np.float32)
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(3)
    try:
        exe(x)
        (prepared,) = exe.plan(x)._prepared.values()
        assert {c.threads for c in prepared.calls if c.kind == KERNEL} == {1}  # the generated kernels' cap, set in C
        assert gomp.omp_get_max_threads() == 3
    finally:
        gomp.omp_set_num_threads(before)


def test_without_the_call_list_routine_every_plan_runs_the_general_path():
    from dpl.backends.cpu.call_list import CallList
    from dpl.backends.registry import CompileError

    def refuse(source):  # what a package's prebuilt kernels say of a library they lack
        raise CompileError("the package holds no kernel for this source")

    backend = CpuBackend(products="dpl")

    backend.call_list = CallList(refuse)
    mod = linear_module()
    exe = dpl.build(mod, backend, progress=None, threads=1)
    x = np.random.default_rng(8).standard_normal((3, 32)).astype(np.float32)
    assert bits(exe(x)) == bits(general(exe.plan(x), [x]))
    assert not exe.plan(x)._prepared


def test_a_plan_with_steps_in_python_is_freed_without_the_garbage_collector():
    """A MixedCall holds its plan weakly: a rebound plan evicted from the executable's cache is
    freed when its last reference goes, not at the next full collection (which over a torch
    process's heap took 250 ms of a generate at fresh cache lengths)."""
    import gc
    import weakref

    from dpl.runtime import executable

    mod = dpl.parse("""
func main(x: f32[n, 64], c: f32[m, 64]) -> (f32[n + m, 64], f32[n, 64]) {
  e = cumsum(x, axis=0)
  y = concat((c, e), axis=0)
  z = nn.softmax(e)
  return (y, z)
}""")
    exe = dpl.build(mod, CpuBackend(), progress=None)
    x = np.ones((1, 64), np.float32)  # its cumsum a step in Python
    refs = []
    gc.disable()
    try:
        for m in range(130, 130 + executable.REBOUND_PLANS + 10):
            c = np.full((m, 64), 0.5, np.float32)
            for _ in range(2):
                y, z = exe(x, c)
            plan = exe.plan(x, c)
            assert any(isinstance(p, MixedCall) for p in plan._prepared.values())
            refs.append(weakref.ref(plan))
            del plan
        evicted = len(refs) - 1 - executable.REBOUND_PLANS  # the first plan is the template, kept
        assert sum(r() is None for r in refs) == evicted > 0  # gone by reference counting alone
    finally:
        gc.enable()
    np.testing.assert_array_equal(y, dpl.interpret(mod, x, c)[0])


def test_an_empty_input_no_step_reads_leaves_the_call_prepared():
    """dynamo's prefill graph of a decoder takes f32[0] placeholders for caches it has not made,
    and reads none of them: the call is prepared (it ran the general path: 1 ms of a 10 ms
    prefill); an empty buffer that a step reads still sends the call to the general path."""
    unused = dpl.parse("""
func main(x: f32[4, 8], cache: f32[0]) -> f32[4, 8] {
  y = exp(multiply(x, 2.0))
  return y
}
""")
    read = dpl.parse("""
func main(x: f32[4, 8], cache: f32[0, 8]) -> f32[4, 8] {
  y = exp(multiply(concat((x, cache), axis=0), 2.0))
  return y
}
""")
    x = np.random.default_rng(7).standard_normal((4, 8)).astype(np.float32)
    for mod, cache, prepared in ((unused, np.zeros(0, np.float32), True), (read, np.zeros((0, 8), np.float32), False)):
        exe = dpl.build(mod, "cpu", progress=None, threads=1)
        assert check_both_ways(exe, (x, cache)) is prepared
        np.testing.assert_allclose(exe(x, cache), np.exp(x * 2.0), rtol=1e-6)


def test_a_plan_called_again_joins_its_consecutive_prepared_runs():
    """Runs are cut where the entry's symbol moves a step's shapes (the concatenation of a cache),
    so that the plans of one bucket share the rest; a plan called again runs them as one
    program, with the same bits, and a length met once keeps its cut runs."""
    from dpl.runtime.prepared import JOIN_AFTER

    mod = dpl.parse("""
func main(table: f32[1, 8], cache: f32[n, 8]) -> (f32[n + 1, 8], f32[1, 8]) {
  e = cumsum(table, axis=0)
  a = exp(multiply(e, 2.0))
  c = concat((cache, a), axis=0)
  d = tanh(multiply(a, 3.0))
  return (c, d)
}
""")
    exe = dpl.build(mod, "cpu", progress=None, threads=1)
    rng = np.random.default_rng(8)

    def shape_of(plan):
        (mixed,) = plan._prepared.values()
        return ["py" if type(p) is not PreparedCall else len(p.calls) for p in mixed.parts]

    for n in (5, 7, *[6] * (JOIN_AFTER + 1)):
        args = (rng.standard_normal((1, 8)).astype(np.float32), rng.standard_normal((n, 8)).astype(np.float32))
        got = exe(*args)
        plan = exe.plan(*args)
        assert bits(got) == bits(general(plan, exe._flat_inputs(args)))
        np.testing.assert_allclose(got[0], np.concatenate([args[1], np.exp(args[0] * 2.0)]), rtol=1e-6)
    assert shape_of(exe.plan(*args)) == ["py", 5]  # the cumsum in Python, then one run of the five C calls
    assert shape_of(exe.plan(args[0], rng.standard_normal((5, 8)).astype(np.float32))) == ["py", 2, 1, 2]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_max_pool_is_prepared(layout):
    """A max pool of its own (not folded into a convolution) is a record of the call list: a
    plan of a convolution and its pool runs as one prepared call, the general path's bits, on
    one thread and two."""
    rng = np.random.default_rng(2)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (2, 8, 20, 18))
    y = fb.emit("nn.relu", fb.emit("nn.conv2d", x, const(rng.standard_normal((16, 8, 3, 3)).astype(np.float32)), padding=[1, 1]))
    pooled = fb.emit("nn.max_pool2d", y, pool_size=[3, 3], strides=[2, 2], padding=[1, 1])
    mod = dpl.apply(Module([fb.ret(fb.emit("exp", pooled))]), ["cnn"], convert_layout=layout == "NHWC")
    args = [rng.standard_normal((2, 8, 20, 18)).astype(np.float32)]
    want = dpl.interpret(mod, *args)
    for threads in (1, 2):
        exe = dpl.build(mod, CpuBackend(), progress=None, threads=threads, adapt_threads=False)
        np.testing.assert_allclose(exe(*args), want, rtol=1e-4, atol=1e-4)
        assert check_both_ways(exe, args), exe.summary()
        (prepared,) = exe.plan(*args)._prepared.values()
        assert isinstance(prepared, PreparedCall)
        pools = [c for c in prepared.calls if c.kind == KERNEL and c.dims[-8:] == (3, 3, 2, 2, 1, 1, 1, 1)]
        assert len(pools) == (1 if layout == "NCHW" else 0), prepared.calls  # NHWC: folded into the convolution
        assert all(c.threads == threads for c in pools)
