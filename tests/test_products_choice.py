"""``CpuBackend(products="auto")`` (backends/cpu/products_choice.py): the fastest provider by
measurement, measured once per machine and kept in the cache directory; torch only where it is
installed; the choice and why in ``exe.summary()``; numbers equal the interpreter either way."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import needs

import dpl
from dpl.backends.cpu import blas, products_choice
from dpl.backends.cpu.products_choice import Measured


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The choice kept in a fresh directory, and no choice remembered by this process."""
    monkeypatch.setattr(products_choice, "store_dir", lambda name: tmp_path / name)
    monkeypatch.setattr(products_choice, "_chosen", {})
    return tmp_path / "products"


def kept(store, **times):
    store.mkdir(mode=0o700, exist_ok=True)
    from dpl.backends.cpu.backend import compiler_version, cpu_identity

    path = store / f"{products_choice._key(cpu_identity(), compiler_version('cc'))}.json"
    path.write_text(json.dumps(times))
    path.chmod(0o600)
    return path


def rand_array(*shape):
    return np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)


def no_measuring(*_, **__):
    raise AssertionError("measured again")


def test_a_kept_choice_for_torch_gives_torch_without_measuring(store, monkeypatch):
    needs.package("torch")
    kept(store, numpy_matmul=2.0, numpy_conv=1.0, torch_matmul=1.5, torch_conv=0.8)
    monkeypatch.setattr(products_choice, "measure", no_measuring)
    chosen = products_choice.products("auto")
    assert isinstance(chosen, blas.TorchProducts) and chosen.name == "torch"
    assert "products by torch" in chosen.why and "torch 1.50 ms vs NumPy 2.00" in chosen.why
    assert not chosen.packs and "the packed routine did not compile" in chosen.why


def test_a_kept_choice_for_numpy_gives_numpy(store, monkeypatch):
    needs.package("torch")
    kept(store, numpy_matmul=1.0, numpy_conv=1.0, torch_matmul=1.5, torch_conv=0.97)  # within the margin: a tie
    monkeypatch.setattr(products_choice, "measure", no_measuring)
    chosen = products_choice.products("auto")
    assert isinstance(chosen, blas.NumpyProducts) and "products by NumPy" in chosen.why and "convolutions by im2col" in chosen.why


def test_each_kind_goes_to_the_library_faster_at_it(store, monkeypatch):
    needs.package("torch")
    kept(store, numpy_matmul=1.0, numpy_conv=1.0, torch_matmul=1.5, torch_conv=0.8)
    monkeypatch.setattr(products_choice, "measure", no_measuring)
    chosen = products_choice.products("auto")
    assert chosen.name == "numpy+torch conv" and not chosen.matmuls and chosen.convolutions
    assert "products by NumPy" in chosen.why and "convolutions by torch" in chosen.why
    from dpl.ir import FunctionBuilder

    fb = FunctionBuilder("main")
    x, w = fb.param("x", "f32", (4, 8)), fb.param("w", "f32", (8, 5))
    fb.emit("matmul", x, w)
    assert chosen.pool_of(fb.bindings[-1].value) == "blas"  # NumPy's BLAS: its own pool
    out = np.empty((4, 5), np.float32)
    x2, w2 = rand_array(4, 8), rand_array(8, 5)
    np.testing.assert_allclose(chosen.matmul(x2, w2, out), x2 @ w2, rtol=1e-5)


def test_the_first_choice_is_measured_and_kept_for_the_next_process(store, monkeypatch):
    needs.package("torch")
    monkeypatch.setattr(products_choice, "NOISY", float("inf"))  # kept however busy this machine is
    first = products_choice.products("auto")
    files = list(store.glob("*.json"))
    assert len(files) == 1
    times = json.loads(files[0].read_text())
    machine, when = times.pop("machine"), times.pop("when")  # in words, for dpl cache info
    assert times.pop("rounds") == products_choice.ROUNDS and 0 <= times.pop("spread") < 10
    assert set(times) == {"numpy_matmul", "numpy_conv", "torch_matmul", "torch_conv", "packed_matmul"}
    assert all(t > 0 for t in times.values())  # the packed routine compiled and was timed too
    assert f"{os.cpu_count()} cores, " in machine and f"; NumPy {np.__version__} with " in machine and ", torch " in machine
    assert when.startswith("20") and when.endswith("+00:00")
    m = Measured(**times)
    assert (first.name != "numpy") == (m.torch_matmuls or m.torch_convolutions)
    assert first.packs == m.packs
    monkeypatch.setattr(products_choice, "_chosen", {})  # a new process: read, not measured
    monkeypatch.setattr(products_choice, "measure", no_measuring)
    assert products_choice.products("auto").name == first.name


def test_a_damaged_choice_is_measured_again(store, monkeypatch):
    needs.package("torch")
    kept(store, numpy_matmul="fast")
    monkeypatch.setattr(products_choice, "measure", lambda cc, load=None: Measured(1.0, 1.0, 2.0, 2.0))
    assert products_choice.products("auto").name == "numpy"


def test_without_torch_auto_measures_numpy_against_the_packed_routine(store, monkeypatch):
    """No torch: NumPy's BLAS for the products, the packed routine for float32 ones
    where it measured faster; torch neither timed nor imported."""
    needs.c_compiler()
    from dpl.backends.cpu.backend import KernelCache

    monkeypatch.setattr(products_choice.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(blas, "TorchProducts", no_measuring)
    monkeypatch.setattr(products_choice, "NOISY", float("inf"))  # kept however busy this machine is
    chosen = products_choice.products("auto", load=KernelCache(store.parent / "kernels").load)
    m = Measured(**json.loads(next(store.glob("*.json")).read_text()))
    assert m.torch_matmul is None and m.torch_conv is None and m.packed_matmul > 0 and m.numpy_matmul > 0
    assert chosen.name == "numpy" and "torch is not installed" in chosen.why and chosen.packs == m.packs


@pytest.mark.parametrize("times, packs", [
    (dict(numpy_matmul=2.0, numpy_conv=1.0, torch_matmul=2.5, torch_conv=2.0, packed_matmul=1.8), True),
    (dict(numpy_matmul=2.0, numpy_conv=1.0, torch_matmul=2.5, torch_conv=2.0, packed_matmul=2.05), True),  # a tie: the routine's (one thread pool)
    (dict(numpy_matmul=2.0, numpy_conv=1.0, torch_matmul=1.5, torch_conv=2.0, packed_matmul=1.8), False),  # torch beat it by the margin
    (dict(numpy_matmul=2.0, numpy_conv=1.0, torch_matmul=1.5, torch_conv=2.0, packed_matmul=1.3), True),
])
def test_the_packed_routine_keeps_the_weights_unless_the_products_library_beat_it(store, monkeypatch, times, packs):
    needs.package("torch")
    kept(store, **times)
    monkeypatch.setattr(products_choice, "measure", no_measuring)
    chosen = products_choice.products("auto")
    assert chosen.packs == packs
    assert ("float32 ones by the packed routine" in chosen.why) == packs
    assert f"packed routine {times['packed_matmul']:.2f} ms" in chosen.why


def fake_measure(calls, **times):
    """A measurement that counts itself in ``calls`` and gives ``times`` (medians, spread)."""
    def measure(cc, load=None):
        calls.append(cc)
        return Measured(**{"numpy_matmul": 1.0, "numpy_conv": 1.0, "torch_matmul": 2.0, "torch_conv": 2.0, "spread": 0.01,
                           **times})
    return measure


@pytest.mark.parametrize("probe, changed", [
    ("cpu", "another CPU model or instruction set"),
    ("blas", "openblas 9.9 (Haswell, pthreads)"),
    ("dpl", "99.0"),
    ("torch", "9.9.9"),
    ("kernel", "0123456789abcdef"),
    ("march", "haswell"),
    ("environment", "AVX2"),
])
def test_a_choice_is_measured_again_when_the_cpu_the_blas_or_a_version_changes(store, monkeypatch, probe, changed):
    """... or the C's instruction sets (``CpuBackend(march=...)``), or the environment holding a
    library to fewer than the CPU has: an AVX2 host's choice, measured on an AVX-512 one."""
    kept(store, numpy_matmul=1.0, numpy_conv=1.0, spread=0.01)
    calls = []
    monkeypatch.setattr(products_choice, "measure", fake_measure(calls))
    assert products_choice.products("auto").name == "numpy" and calls == []  # the kept choice: read
    from dpl.backends.cpu import toolchain

    real_version = products_choice._version
    monkeypatch.setattr(products_choice, "_chosen", {})  # a new process, on a changed machine
    if probe == "cpu":
        monkeypatch.setattr(toolchain, "cpu_identity", lambda: changed)
    elif probe == "blas":
        monkeypatch.setattr(products_choice, "_blas", lambda: changed)
    elif probe == "kernel":
        monkeypatch.setattr(products_choice, "_kernel_digest", lambda: changed)
    elif probe == "environment":
        monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", changed)
    elif probe != "march":
        monkeypatch.setattr(products_choice, "_version", lambda dist: changed if dist == probe else real_version(dist))
    products_choice.products("auto", march=changed if probe == "march" else "native")
    assert calls == ["cc"]  # measured again, and kept beside the other machine's
    assert len(list(store.glob("*.json"))) == 2


def test_a_noisy_measurement_is_used_by_this_process_only(store, monkeypatch, caplog):
    calls = []
    monkeypatch.setattr(products_choice, "measure", fake_measure(calls, numpy_conv=2.0, torch_conv=1.0, spread=0.5))
    with caplog.at_level("WARNING", logger=products_choice.__name__):
        chosen = products_choice.products("auto")
    assert chosen.name == "numpy+torch conv" and "too noisy to keep" in chosen.why  # used here
    assert "spread 50% (more than 20%" in caplog.text and "not kept" in caplog.text
    assert not list(store.glob("*.json"))  # not kept
    products_choice.products("auto")
    assert len(calls) == 1  # this process keeps using it
    monkeypatch.setattr(products_choice, "_chosen", {})  # the next process measures again, and keeps a quiet one
    monkeypatch.setattr(products_choice, "measure", fake_measure(calls))
    assert products_choice.products("auto").name == "numpy" and len(calls) == 2
    assert len(list(store.glob("*.json"))) == 1


def test_a_kept_noisy_file_is_not_trusted(store, monkeypatch):
    kept(store, numpy_matmul=1.0, numpy_conv=2.0, torch_matmul=2.0, torch_conv=1.0, spread=0.9)
    calls = []
    monkeypatch.setattr(products_choice, "measure", fake_measure(calls))
    assert products_choice.products("auto").name == "numpy" and calls == ["cc"]


def test_the_rounds_are_interleaved_and_the_choice_goes_by_their_medians(monkeypatch):
    """A, B, A, B, ...; a contender whose best round is fast but whose median is not does not win."""
    order = []
    fns = [lambda: order.append("a"), lambda: order.append("b")]
    assert len(products_choice._rounds_ms(fns, 3)[0]) == 3
    assert order == ["a", "b"] * 4  # a warm call each, then three rounds in turn
    rounds = {"numpy": [2.0, 2.0, 2.0, 2.1, 2.0], "conv": [1.0] * 5, "packed": [0.5, 2.2, 2.1, 2.3, 2.2]}
    monkeypatch.setattr(products_choice.importlib.util, "find_spec", lambda name: None)  # no torch
    monkeypatch.setattr(products_choice, "_layer", lambda cc, load, torch: (object(), None, object()))
    monkeypatch.setattr(products_choice, "_rounds_ms", lambda fns, n: [rounds["numpy"], rounds["conv"], rounds["packed"]])
    m = products_choice.measure()
    assert (m.numpy_matmul, m.packed_matmul) == (2.0, 2.2) and not m.packs  # the best round (0.5) would have won
    assert m.spread == pytest.approx(products_choice.spread(rounds["packed"]))


@pytest.mark.parametrize("packed, packs", [(1.9, True), (2.0, True), (2.1, True), (2.11, False), (2.5, False)])
def test_blas_takes_the_products_only_where_it_beats_the_packed_routine_by_the_margin(packed, packs):
    m = Measured(numpy_matmul=2.0, numpy_conv=1.0, packed_matmul=packed)
    assert products_choice.MARGIN == 0.95 and m.packs == packs
    assert m.choice().startswith(f"products by NumPy, float32 ones by {'the packed routine' if packs else 'NumPy'}")


def test_spread_is_the_interquartile_range_over_the_median():
    assert products_choice.spread([1.0, 1.0, 1.0, 1.0]) == 0.0
    assert products_choice.spread([1.0, 1.0, 1.0, 1.0, 100.0]) == 0.0  # one outlier does not count
    assert products_choice.spread([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.0 - 2.0) / 3.0)
    assert products_choice.spread([5.0]) == 0.0


def test_the_summary_says_which_products_and_why(store, tmp_path):
    needs.c_compiler()
    from dpl.backends.cpu.backend import CpuBackend

    mod = dpl.parse("""
func main(x: f32[16, 32], w: f32[32, 24]) -> f32[16, 24] {
  m = matmul(x, w)
  y = nn.relu(m)
  return y
}""")
    cpu = CpuBackend(cache_dir=tmp_path / "kernels")
    assert "not chosen yet" in cpu.notes()[0]
    exe = dpl.build(mod, [cpu, "numpy"], config=dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0))
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((16, 32), np.float32), rng.standard_normal((32, 24), np.float32)
    np.testing.assert_allclose(exe(x, w), dpl.interpret(mod, x, w), rtol=1e-5, atol=1e-5)
    summary = exe.summary()
    assert f"products: {cpu.products.name} (" in summary and "auto, the faster of each measured here" in summary
    from dpl.runtime import heap

    assert heap.keep_mapped() in summary  # what was done with freed memory (dpl/runtime/heap.py)


def test_an_unknown_products_name_is_a_located_error():
    from dpl.backends.cpu.backend import CpuBackend

    with pytest.raises(dpl.DplError, match="unknown products library 'mkl'"):
        CpuBackend(products="mkl")


def test_a_plan_without_torch_work_never_imports_torch(tmp_path):
    """With convolutions chosen for torch and products for NumPy, a plan of products alone runs
    without importing torch (seconds of start-up); ``import dpl`` never imports it."""
    needs.package("torch")
    needs.c_compiler()
    script = textwrap.dedent("""
        import json, sys
        import numpy as np
        import dpl
        assert "torch" not in sys.modules, "import dpl imported torch"
        from dpl.backends.cpu import products_choice
        from dpl.backends.cpu.backend import CpuBackend, compiler_version, cpu_identity
        from dpl.cache_dir import make_private_dirs, store_dir
        folder = store_dir("products")
        make_private_dirs(folder)
        path = folder / f"{products_choice._key(cpu_identity(), compiler_version('cc'))}.json"
        path.write_text(json.dumps(dict(numpy_matmul=1.0, numpy_conv=1.0, torch_matmul=2.0, torch_conv=0.5)))
        path.chmod(0o600)
        mod = dpl.parse('''
        func main(x: f32[16, 32], w: f32[32, 24]) -> f32[16, 24] {
          m = matmul(x, w)
          y = nn.relu(m)
          return y
        }''')
        cpu = CpuBackend(cache_dir=sys.argv[1])
        exe = dpl.build(mod, [cpu, "numpy"], config=dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0))
        x, w = np.ones((16, 32), np.float32), np.ones((32, 24), np.float32)
        assert np.allclose(exe(x, w), 32.0)
        assert cpu.products.name == "numpy+torch conv", cpu.products.name
        print("torch imported" if "torch" in sys.modules else "torch not imported")
    """)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "kernels")], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "torch not imported"
