"""Outputs of plain calls come from a pool of released buffers: a caller that keeps its results
(or any view of them) gets distinct memory with the right values; released results are reused."""

import gc
import threading

import numpy as np

import dpl
from runtime_corpus import inputs_for, symbolic

N = {"n": 64}


def build():
    mod = symbolic()
    return mod, dpl.build(mod, "numpy")


def args_for(mod, seed):
    return inputs_for(mod, N, seed=seed)


def test_results_kept_are_distinct_and_correct():
    mod, exe = build()
    calls = [args_for(mod, seed) for seed in range(5)]
    kept = [exe(*args) for args in calls]
    for args, got in zip(calls, kept):
        np.testing.assert_allclose(got, dpl.interpret(mod, *args), rtol=1e-6)
    for i in range(len(kept)):
        for j in range(i):
            assert not np.may_share_memory(kept[i], kept[j])


def test_released_results_are_reused():
    mod, exe = build()
    args = args_for(mod, 0)
    first = exe(*args)
    address = first.ctypes.data
    del first
    gc.collect()
    again = exe(*args)
    assert again.ctypes.data == address
    np.testing.assert_allclose(again, dpl.interpret(mod, *args), rtol=1e-6)
    assert exe.plan(*args).output_pool.reused >= 1


def test_a_view_still_held_keeps_its_buffer():
    mod, exe = build()
    a, b = args_for(mod, 1), args_for(mod, 2)
    part = exe(*a)[3:5]  # the whole result is dropped, a slice of it is kept
    want = dpl.interpret(mod, *a)[3:5].copy()
    for _ in range(4):
        other = exe(*b)
        assert not np.may_share_memory(other, part)
    np.testing.assert_array_equal(part, want)


def test_out_bypasses_the_pool():
    mod, exe = build()
    args = args_for(mod, 3)
    out = np.empty_like(dpl.interpret(mod, *args))
    assert exe(*args, out=out) is out
    assert exe.plan(*args).output_pool.reused == 0


def test_threads_never_share_a_pooled_buffer():
    mod, exe = build()
    inputs = [args_for(mod, seed) for seed in range(4)]
    want = [dpl.interpret(mod, *args) for args in inputs]
    wrong, start = [0] * 4, threading.Barrier(4)

    def work(t):
        start.wait()
        for _ in range(30):
            got = exe(*inputs[t])
            if not np.allclose(got, want[t], rtol=1e-6):
                wrong[t] += 1

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert wrong == [0] * 4
