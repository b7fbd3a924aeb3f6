"""A lone index_put in C (backends/cpu/index_put.py): the interpreter's values for any index
arrays that broadcast, negative and repeated indices, values that broadcast, every fixed-size
dtype (added up in four), on the general path and in a prepared call; an index out of range is
the interpreter's error on both, and a static cache's update no longer cuts a prepared call."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dpl
import needs
from dpl.backends.cpu.backend import CpuBackend
from dpl.ir import FunctionBuilder, Module, Tuple as TupleExpr
from dpl.runtime.prepared import MixedCall, PreparedCall


@pytest.fixture(scope="module", autouse=True)
def _compiler():
    needs.c_compiler()


BACKEND = {}


def cpu():
    """One backend for the file (its routine compiled once)."""
    if "cpu" not in BACKEND:
        BACKEND["cpu"] = CpuBackend()
    return BACKEND["cpu"]


def module(data, indices, values, dtype, index_dtypes, accumulate, tail="none"):
    """index_put(x, (i...), v), then (``tail``) a C kernel reading its result, so the plan has
    a step around it."""
    fb = FunctionBuilder("main")
    x = fb.param("x", dtype, data)
    idx = [fb.param(f"i{k}", t, s) for k, (s, t) in enumerate(zip(indices, index_dtypes))]
    v = fb.param("v", dtype, values)
    out = fb.emit("index_put", x, TupleExpr(tuple(idx)), v, accumulate=accumulate)
    if tail == "kernel":
        out = fb.emit("multiply", out, out)
    return Module([fb.ret(out)])


def broadcastable(draw, shape):
    """A shape that broadcasts (right-aligned) to ``shape``: some axes 1, some leading ones dropped."""
    drop = draw(st.integers(0, len(shape)))
    return tuple(d if draw(st.booleans()) else 1 for d in shape[drop:])


@st.composite
def cases(draw):
    rank = draw(st.integers(1, 4))
    data = tuple(draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank)))
    k = draw(st.integers(1, rank))
    bshape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=3)))
    indices = [broadcastable(draw, bshape) for _ in range(k)]
    if bshape and all(len(s) < len(bshape) for s in indices):
        indices[0] = bshape  # one index of the full broadcast rank
    dtype = draw(st.sampled_from(["float32", "float64", "int32", "int64", "float16", "bool", "int8", "uint8"]))
    accumulate = dtype in ("float32", "float64", "int32", "int64") and draw(st.booleans())
    index_dtypes = [draw(st.sampled_from(["int64", "int32", "int16", "int8", "uint8"])) for _ in range(k)]
    nb = max(len(s) for s in indices)
    full = tuple(max((s[b - nb + len(s)] for s in indices if b - nb + len(s) >= 0), default=1) for b in range(nb))
    values = broadcastable(draw, (*full, *data[k:]))
    seed = draw(st.integers(0, 2**31 - 1))
    return data, indices, values, dtype, index_dtypes, accumulate, seed


def arrays(data, indices, values, dtype, index_dtypes, seed, negative=True):
    rng = np.random.default_rng(seed)

    def tensor(shape):
        if dtype == "bool":
            return rng.random(shape) < 0.5
        return (rng.standard_normal(shape) * 10).astype(dtype)

    idx = []
    for a, (shape, t) in enumerate(zip(indices, index_dtypes)):
        low = -data[a] if negative and t not in ("uint8",) else 0
        idx.append(rng.integers(low, data[a], shape).astype(t))
    return [tensor(data), *idx, tensor(values)]


@settings(max_examples=150, deadline=None)
@given(cases())
def test_the_c_index_put_equals_the_interpreter(case):
    data, indices, values, dtype, index_dtypes, accumulate, seed = case
    mod = module(data, indices, values, dtype, index_dtypes, accumulate)
    args = arrays(data, indices, values, dtype, index_dtypes, seed)
    want = dpl.interpret(mod, *args)
    exe = dpl.build(mod, cpu(), progress=None)
    plan = exe.plan(*args)
    general = plan.run(args, None, timer=lambda step, run: run())  # the general path
    prepared = exe(*args)  # a prepared call
    for got in (general, prepared):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert isinstance(next(iter(plan._prepared.values())), PreparedCall)


def test_repeated_indices_write_last_or_add_up_in_order():
    data, at = (6, 3), np.array([2, -4, 2, 5, 2])
    values = np.arange(15, dtype=np.float32).reshape(5, 3) + 0.25
    x = np.full(data, 1e8, np.float32)  # additions in another order would round otherwise
    for accumulate in (False, True):
        mod = module(data, [(5,)], (5, 3), "float32", ["int64"], accumulate, tail="kernel")
        exe = dpl.build(mod, cpu(), progress=None)
        got = exe(x, at, values)
        np.testing.assert_array_equal(got, dpl.interpret(mod, x, at, values))
        assert not np.array_equal(got, x * x)


def test_an_index_out_of_range_is_the_interpreters_error_and_the_next_call_runs():
    mod = module((4, 8), [(2,)], (2, 8), "float32", ["int64"], False, tail="kernel")
    exe = dpl.build(mod, cpu(), progress=None)
    x, v = np.ones((4, 8), np.float32), np.full((2, 8), 3.0, np.float32)
    plan = exe.plan(x, np.array([0, 1]), v)
    for bad, shown in ((4, 4), (-5, -5)):
        for run in (lambda a: exe(*a), lambda a: plan.run(a, None, timer=lambda step, r: r())):
            with pytest.raises(dpl.DplError, match=f"index {shown} is out of range for axis 0 of size 4"):
                run([x, np.array([0, bad]), v])
            got = exe(x, np.array([3, -1]), v)  # the error word is clear again
            np.testing.assert_array_equal(got, dpl.interpret(mod, x, np.array([3, -1]), v))
    np.testing.assert_array_equal(x, np.ones((4, 8), np.float32))  # the input untouched


def test_a_static_caches_update_is_part_of_the_prepared_call():
    """A decode step's cache write (Hugging Face's index_copy_ as AOTAutograd gives it) between
    two kernels: prepared with them (runs split where the cache length moves), no step in Python."""
    fb = FunctionBuilder("main")
    cache = fb.param("cache", "f32", (1, 4, "n", 64))
    i0, i1, pos = fb.param("i0", "i64", (1, 1, 1)), fb.param("i1", "i64", (1, 4, 1)), fb.param("pos", "i64", (1,))
    new = fb.param("new", "f32", (1, 4, 1, 64))
    scaled = fb.emit("multiply", new, new)
    put = fb.emit("index_put", cache, TupleExpr((i0, i1, pos)), scaled)
    mod = Module([fb.ret(fb.emit("add", put, put))])
    exe = dpl.build(mod, cpu(), progress=None)
    rng = np.random.default_rng(3)
    for n, at in ((16, 5), (16, -1), (20, 19)):
        args = [rng.standard_normal((1, 4, n, 64)).astype(np.float32), np.zeros((1, 1, 1), np.int64),
                np.arange(4).reshape(1, 4, 1), np.array([at]), rng.standard_normal((1, 4, 1, 64)).astype(np.float32)]
        np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
        prepared = list(exe.plan(*args)._prepared.values())
        parts = [q for p in prepared for q in (p.parts if isinstance(p, MixedCall) else (p,))]
        assert parts and all(isinstance(q, PreparedCall) for q in parts)  # runs of C calls only, none in Python


def cache_module(reread: bool = False):
    """A cache updated at a position, then read through a view and a kernel; ``reread``: the
    cache's old values read by another step too."""
    fb = FunctionBuilder("main")
    cache, pos, new = fb.param("cache", "f32", (4, "n", 8)), fb.param("pos", "i64", (1,)), fb.param("new", "f32", (4, 1, 8))
    i0 = fb.param("i0", "i64", (4, 1))
    put = fb.emit("index_put", cache, TupleExpr((i0, pos)), new)
    seen = fb.emit("reshape", put, shape=[4, -1])
    outs = [put, fb.emit("multiply", seen, seen)]
    if reread:
        outs.append(fb.emit("add", cache, cache))
    return Module([fb.ret(TupleExpr(tuple(outs)))])


def cache_arrays(n=6, at=2, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((4, n, 8)).astype(np.float32), np.array([at]), rng.standard_normal((4, 1, 8)).astype(np.float32),
            np.arange(4).reshape(4, 1)]


def test_an_output_that_is_its_input_updated_is_written_in_the_inputs_memory():
    """Executable.call_in_place: the updated cache is the input's own array (nothing copied);
    the other results read it updated; on both the prepared call and the general path."""
    mod = cache_module()
    exe = dpl.build(mod, cpu(), progress=None)
    for n, at in ((6, 2), (6, -1), (9, 0)):
        args = cache_arrays(n, at)
        want = dpl.interpret(mod, *[a.copy() for a in args])
        cache = args[0]
        got = exe.call_in_place(args, [(0, 0)])
        assert got[0] is cache
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        plan = exe.plan(*args)
        assert plan.in_place([(0, 0), (1, 0), (0, 2), (5, 0)]) == ((0, 0),)
        args = cache_arrays(n, at, seed=1)
        want = dpl.interpret(mod, *[a.copy() for a in args])
        got = plan.run(args, None, timer=lambda step, run: run(), in_place=[(0, 0)])  # the general path
        assert got[0] is args[0]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_an_input_another_step_reads_is_never_written():
    mod = cache_module(reread=True)
    exe = dpl.build(mod, cpu(), progress=None)
    args = cache_arrays()
    before = args[0].copy()
    want = dpl.interpret(mod, *[a.copy() for a in args])
    got = exe.call_in_place(args, [(0, 0)])
    assert got[0] is not args[0] and exe.plan(*args).in_place([(0, 0)]) == ()
    np.testing.assert_array_equal(args[0], before)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    strided = cache_arrays()  # an input that is not C-contiguous is no place to write
    strided[0] = np.asfortranarray(strided[0])
    got = dpl.build(cache_module(), cpu(), progress=None).call_in_place(strided, [(0, 0)])
    assert got[0] is not strided[0]
