"""The shortcuts a repeated call takes (issue 31: at most 20 us of dpl's Python per call, see
bench/bench_dispatch.py) give what the general path gives, and step aside whenever what they
assume breaks: another shape, another dtype, a non-contiguous input, something that is not an
array, a weight changed in place."""

from __future__ import annotations

import gc
import math
import sys

import numpy as np
import pytest

import dpl
import needs
from dpl.errors import DplError

# a product and an add fused into one group (the CPU runs it as BLAS-like segments), then a GELU
MODULE = """\
func main(x: f32[n, 8], w: f32[8, 8], b: f32[8]) -> f32[n, 8] {
  y = matmul(x, w)
  z = add(y, b)
  g = nn.gelu(z)
  return g
}
"""


def reference(x, w, b):
    z = x.astype(np.float64) @ w + b
    return 0.5 * z * (1 + np.vectorize(math.erf)(z / np.sqrt(2)))


@pytest.fixture(scope="module")
def exe():
    needs.c_compiler()
    return dpl.build(dpl.apply(dpl.parse(MODULE), ["rewrites"]), "cpu", threads=1, progress=None)


@pytest.fixture(scope="module")
def weights():
    rng = np.random.default_rng(0)
    return rng.standard_normal((8, 8)).astype("float32"), rng.standard_normal(8).astype("float32")


def x_of(n, seed=1):
    return np.random.default_rng(seed).standard_normal((n, 8)).astype("float32")


def check(out, x, w, b):
    np.testing.assert_allclose(out, reference(x, w, b), rtol=1e-4, atol=1e-5)


def test_a_repeated_call_takes_the_latest_plan_and_gives_fresh_results(exe, weights):
    w, b = weights
    x = x_of(3)
    first = exe(x, w, b)
    second = exe(x, w, b)
    assert exe._last_plan((x, w, b)) is exe.plan(x, w, b)  # the shortcut is taken
    check(first, x, w, b)
    np.testing.assert_array_equal(first, second)
    assert not np.shares_memory(first, second)  # the first result, still held, is not overwritten


def test_other_shapes_in_turn_each_get_their_own_plan(exe, weights):
    w, b = weights
    for n in (2, 5, 2, 7, 5, 2):
        x = x_of(n, seed=n)
        check(exe(x, w, b), x, w, b)
    assert {sig[0][0] for sig in exe.plans} >= {(2, 8), (5, 8), (7, 8)}


def test_a_non_contiguous_input_after_a_contiguous_one(exe, weights):
    w, b = weights
    x = x_of(4)
    check(exe(x, w, b), x, w, b)
    strided = np.asfortranarray(x)  # the same shape and dtype, other strides
    assert exe._last_plan((strided, w, b)) is not None  # the plan fits: its kernels take strided inputs
    check(exe(strided, w, b), x, w, b)
    every_other = x_of(8)[::2]
    check(exe(every_other, w, b), every_other, w, b)
    check(exe(w=w, b=b, x=x), x, w, b)  # by name, through the general path


def test_another_dtype_or_not_an_array_goes_the_general_way(exe, weights):
    w, b = weights
    x = x_of(3)
    exe(x, w, b)
    assert exe._last_plan((x.astype("float64"), w, b)) is None
    with pytest.raises(DplError, match="float64"):
        exe(x.astype("float64"), w, b)
    view = memoryview(x)  # not an ndarray: the general path makes it one
    assert exe._last_plan((view, w, b)) is None
    check(exe(view, w, b), x, w, b)
    with pytest.raises(DplError, match="takes 3 inputs"):
        exe(x, w)


def test_a_read_only_input_reads_where_it_lies(exe, weights):
    w, b = weights
    x = x_of(3)
    exe(x, w, b)
    frozen = x.copy()
    frozen.flags.writeable = False
    check(exe(frozen, w, b), x, w, b)


def test_addresses_are_numpys_for_every_kind_of_array():
    from dpl.backends.cpu.addresses import _READ_ONLY, address

    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    frozen = a.copy()
    frozen.flags.writeable = False
    assert all(address(arr) == arr.ctypes.data for arr in (a, a[1:], a[:, 2:], a.T, np.zeros(0, np.float32), frozen, frozen[2:]))
    assert address(frozen) == frozen.ctypes.data  # the second time from the cache
    key = id(frozen)
    assert key in _READ_ONLY
    del frozen  # the last reference (the views above are gone)
    gc.collect()
    assert key not in _READ_ONLY  # forgotten when the array dies: a new array with its id is not taken for it


def test_the_thread_budget_is_skipped_only_where_it_changes_nothing():
    from dpl.runtime.threads import BLAS, OPENMP, budget_binds

    assert not budget_binds(None, None)
    assert budget_binds(1, None)  # a step that declares no pools may use a BLAS
    assert budget_binds(1, frozenset({BLAS}))
    torch = sys.modules.get("torch")
    expected = torch is not None and torch.get_num_threads() > 1
    assert budget_binds(1, frozenset({OPENMP})) == expected


def test_a_compiled_model_falls_back_on_a_changed_weight_and_follows_new_inputs():
    torch = needs.package("torch")
    needs.c_compiler()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    compiled = dpl.compile(model, threads=1, dynamic=True)
    with torch.no_grad():
        for x in (torch.randn(2, 8), torch.randn(2, 8), torch.randn(5, 8), torch.randn(8, 2).t(),
                  torch.randn(3, 8, dtype=torch.float64).float(), torch.randn(2, 8).requires_grad_()):
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
        assert all(p.runs == "dpl" for g in compiled.dpl_report.graphs for p in g.parts if p.name.startswith("dpl"))
        model[0].weight.mul_(2)  # in place: the built-in constant is stale now
        x = torch.randn(2, 8)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)
