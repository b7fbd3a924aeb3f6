"""A plan that calls both NumPy's BLAS and OpenMP kernels runs the OpenMP kernels on one thread
(dpl.runtime.threads: the two pools' spinning workers would share the cores); a plan with one
pool keeps its threads. Numbers stay those of the interpreter either way."""

import numpy as np
import pytest

import needs

import dpl
from dpl.runtime.threads import BLAS, OPENMP, one_pool_kernels


@pytest.fixture
def cpu(tmp_path):
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    return CpuBackend(cache_dir=tmp_path, products="numpy")  # the BLAS pool beside OpenMP: the rule under test


FUSE_ALL = dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0)

MIXED = dpl.parse("""
func main(x: f32[32, 64], w: f32[64, 48], s: f32[32, 48]) -> (f32[32, 48], f32[32, 48]) {
  m = matmul(x, w)
  z = nn.silu(m)
  a = nn.relu(s)
  b = exp(a)
  return (z, b)
}""")

C_ONLY = dpl.parse("""
func main(s: f32[32, 48]) -> f32[32, 48] {
  a = nn.relu(s)
  b = exp(a)
  return b
}""")


def args_for(mod, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(p.ty.shape)).astype(np.float32) for p in mod["main"].params]


def c_kernels(plan):
    """The plan's OpenMP kernels that can change their thread count (a BLAS segment's parts are
    always on one thread)."""
    return [s.kernel for s in plan.steps if hasattr(s.kernel, "with_threads")]


def test_a_plan_with_blas_runs_its_openmp_kernels_on_one_thread(cpu):
    fused = dpl.apply(MIXED)
    exe = dpl.build(fused, [cpu, "numpy"], config=FUSE_ALL)
    args = args_for(MIXED)
    for got, want in zip(exe(*args), dpl.interpret(MIXED, *args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    plan = exe.plan(*args)
    pools = set().union(*(getattr(s.kernel, "thread_pools", ()) for s in plan.steps))
    assert pools == {BLAS, OPENMP}
    assert c_kernels(plan) and all(k.threads == 1 for k in c_kernels(plan))
    assert "OpenMP kernels on one thread: the plan also calls BLAS" in exe.summary()


def test_a_plan_without_blas_keeps_every_thread(cpu):
    exe = dpl.build(dpl.apply(C_ONLY), [cpu, "numpy"], config=FUSE_ALL)
    args = args_for(C_ONLY)
    np.testing.assert_allclose(exe(*args), dpl.interpret(C_ONLY, *args), rtol=1e-6)
    plan = exe.plan(*args)
    assert c_kernels(plan) and all(k.threads is None for k in c_kernels(plan))
    assert "on one thread" not in exe.summary()


def test_capping_does_not_change_the_shared_kernel(cpu):
    """The capped kernel is a new callable: another plan using the same cached kernel alone
    keeps all threads."""
    from dpl.runtime.cache import KernelCache

    cache = KernelCache()
    mixed = dpl.build(dpl.apply(MIXED), [cpu, "numpy"], config=FUSE_ALL, cache=cache)
    alone = dpl.build(dpl.apply(C_ONLY), [cpu, "numpy"], config=FUSE_ALL, cache=cache)
    assert all(k.threads == 1 for k in c_kernels(mixed.plan(*args_for(MIXED))))
    assert all(k.threads is None for k in c_kernels(alone.plan(*args_for(C_ONLY))))


def fake(pools, threads=None):
    def kernel(inputs, outputs):
        pass

    kernel.thread_pools = frozenset(pools)
    kernel.threads = threads
    if OPENMP in pools:
        kernel.with_threads = lambda n: fake(pools, n)
    return kernel


def test_one_pool_kernels_caps_only_openmp_kernels_of_mixed_sets():
    c, blas, plain = fake({OPENMP}), fake({BLAS}), lambda i, o: None
    assert one_pool_kernels([c, plain]) == {}
    assert one_pool_kernels([blas, plain]) == {}
    capped = one_pool_kernels([c, blas, plain])
    assert set(capped) == {id(c)} and capped[id(c)].threads == 1
    both = fake({OPENMP, BLAS})  # a kernel that uses both pools on its own counts as mixed
    assert set(one_pool_kernels([both, c])) == {id(both), id(c)}


def test_a_thread_budget_caps_openmp_kernels_and_blas(cpu, monkeypatch):
    from dpl.runtime import threads as th

    exe = dpl.build(dpl.apply(C_ONLY), [cpu, "numpy"], config=FUSE_ALL, threads=2)
    assert all(k.threads == 2 for k in c_kernels(exe.plan(*args_for(C_ONLY))))
    assert "thread budget 2" in exe.summary()
    seen = []

    class Lib:  # a BLAS on 4 threads, as threadpoolctl hands it over
        n = 4

        def get_num_threads(self):
            return self.n

        def set_num_threads(self, n):
            self.n = n

    lib = Lib()
    monkeypatch.setattr(th, "_blas_controllers", lambda: [lib])
    mixed = dpl.build(dpl.apply(MIXED), [cpu, "numpy"], config=FUSE_ALL, threads=1)
    step = mixed.plan(*args_for(MIXED)).steps[0]
    real = step.kernel
    object.__setattr__(step, "kernel", lambda ins, outs: (seen.append(lib.n), real(ins, outs)))
    args = args_for(MIXED)
    for got, want in zip(mixed(*args), dpl.interpret(MIXED, *args)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert seen == [1] and lib.n == 4  # capped during the call, restored after
    with pytest.raises(dpl.DplError, match="threads must be a positive integer"):
        dpl.build(C_ONLY, "numpy", threads=0)


def test_blas_threads_through_threadpoolctl():
    from threadpoolctl import threadpool_info

    from dpl.runtime.threads import blas_threads

    before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
    with blas_threads(1):
        assert all(i["num_threads"] == 1 for i in threadpool_info() if i["user_api"] == "blas")
    assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before


def test_a_budget_caps_torch_for_the_call_and_restores_it():
    """torch's MKL products and oneDNN convolutions follow torch's own thread count (an OpenMP cap
    alone does not bind MKL), so a budget sets it for the call and puts it back."""
    torch = needs.package("torch")
    from dpl.runtime.threads import budget_threads

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with budget_threads(1):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        with budget_threads(None):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_blas_loaded_later_is_capped_too(monkeypatch):
    """The BLAS controllers are found again once modules were imported since (torch.compile
    loaded a BLAS after the first scan, which then ran uncapped)."""
    import sys
    import types

    import threadpoolctl

    from dpl.runtime import threads

    scans = []

    class Controller:
        def __init__(self):
            scans.append(1)

        def select(self, user_api):
            return types.SimpleNamespace(lib_controllers=[object()] * len(scans))

    monkeypatch.setattr(threadpoolctl, "ThreadpoolController", Controller)
    monkeypatch.setattr(threads, "_CONTROLLERS", None)
    assert len(threads._blas_controllers()) == 1
    assert len(threads._blas_controllers()) == 1 and len(scans) == 1  # nothing imported: no rescan
    monkeypatch.setitem(sys.modules, "a_module_bringing_a_blas", types.ModuleType("a_module_bringing_a_blas"))
    assert len(threads._blas_controllers()) == 2 and len(scans) == 2


def test_a_budget_leaves_alone_a_blas_no_step_uses(cpu, monkeypatch):
    """Capping and restoring a BLAS costs about 10 us a call: a plan whose steps all declare
    their pools, none the BLAS, leaves it alone; a step that declares nothing (a NumPy
    reference may call the BLAS) keeps every pool capped."""
    from dpl.runtime import threads as th

    class Lib:
        n, sets = 4, 0

        def get_num_threads(self):
            return self.n

        def set_num_threads(self, n):
            self.n, self.sets = n, self.sets + 1

    lib = Lib()
    monkeypatch.setattr(th, "_blas_controllers", lambda: [lib])
    args = args_for(C_ONLY)
    c_only = dpl.build(dpl.apply(C_ONLY), [cpu, "numpy"], config=FUSE_ALL, threads=1)
    c_only(*args)
    plan = c_only.plan(*args)
    assert plan.pools is not None and BLAS not in plan.pools and lib.sets == 0
    reference = dpl.build(C_ONLY, "numpy", threads=1)
    reference(*args)
    assert reference.plan(*args).pools is None and lib.sets == 2 and lib.n == 4  # capped, then restored


def products_module():
    """A convolution with its ReLU and max pool (channels-last after convert-layout: dpl's own
    routines) beside a product of a constant weight (the packed routine)."""
    from dpl.ir import FunctionBuilder, const
    from dpl.ir.expr import Module

    rng = np.random.default_rng(3)
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", (1, 8, 16, 16))
    a = fb.param("a", "f32", (64, 96))
    y = fb.emit("nn.relu", fb.emit("nn.conv2d", x, const(rng.standard_normal((32, 8, 3, 3)).astype(np.float32)), padding=[1, 1]))
    y = fb.emit("nn.max_pool2d", y, pool_size=[2, 2], strides=[2, 2])
    m = fb.emit("matmul", a, const(rng.standard_normal((96, 128)).astype(np.float32)))
    return dpl.apply(Module([fb.ret(y, m)]), ["cnn"], convert_layout=True)


def test_a_budget_reaches_the_products_and_convolutions_of_dpl_s_routines(tmp_path):
    """The segments (a product or convolution and the C around it) take the plan's budget: each
    of their OpenMP parts and products is built capped at it. Before, they took OpenMP's default
    team (every core) whatever ``threads=`` said, hidden where torch had set that default."""
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    backend = CpuBackend(cache_dir=tmp_path, products="dpl")
    mod = products_module()
    args = args_for(mod)
    want = dpl.interpret(mod, *args)
    for threads in (1, 2):
        exe = dpl.build(mod, [backend, "numpy"], threads=threads)
        for got, expected in zip(exe(*args), want):
            np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
        segments = [s.kernel for s in exe.plan(*args).steps if s.kernel.__qualname__.startswith("cpu-blas+c:")]
        assert len(segments) == 2 and all(k.threads == threads for k in segments)
        routines = [fn for k in segments for fn in k.products]
        assert len(routines) == 2 and all(fn.threads == threads for fn in routines)  # conv and its pool, product
        assert all(k.with_threads(threads) is k for k in segments)
