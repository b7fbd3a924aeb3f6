"""The public API for backend authors: ``dpl.backends.read_composite`` (a composite as plain
data), ``dpl.backends.KernelCache``; the example plugin keeps to that API; and the Python of
docs/writing-a-backend.md runs as written, printing what the page says it prints."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import dpl
from dpl.backends import CompositeError, read_composite

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "writing-a-backend.md"
EXAMPLE = ROOT / "examples" / "dpl_mylib_backend"


@pytest.fixture(scope="module")
def llama():
    return dpl.apply(dpl.parse((ROOT / "examples" / "llama_mlp.ir").read_text()), ["llm"])


def test_a_shipped_librarys_composite_through_its_codegen_wrapper(llama):
    comp = read_composite(llama["fused_nn_rms_norm_kernel"], llama)
    assert (comp.name, comp.prefix, comp.function) == ("kernel.rms_norm", "kernel", "fused_nn_rms_norm")
    assert [(p.name, p.dtype, p.shape) for p in comp.params] == [("x", "float32", ("n", 256)), ("norm_w", "float32", (256,))]
    [b] = comp.bindings
    assert (b.name, b.op, b.args, b.dtype, b.shape) == ("h", "nn.rms_norm", ("x", "norm_w"), "float32", ("n", 256))
    assert b.attrs == {"axes": (-1,), "epsilon": 1e-06}  # every attribute, defaults filled in
    assert type(b.attrs) is dict and type(b.attrs["epsilon"]) is float and type(b.attrs["axes"][0]) is int
    assert comp.outputs == ("h",) and dict(comp.constants) == {}
    assert read_composite(llama["fused_nn_rms_norm"]) == comp  # the composite itself reads the same


def test_bindings_in_order_and_the_kind_of_each_name(llama):
    comp = read_composite(llama["fused_nn_silu_multiply_kernel"], llama)
    assert comp.name == "kernel.swiglu"
    assert [(b.name, b.op, b.args) for b in comp.bindings] == [("act", "nn.silu", ("gate",)), ("prod", "multiply", ("act", "up"))]
    assert [comp.kind(n) for n in ("gate", "act")] == ["param", "binding"]
    assert comp.binding("prod").shape == ("n", 688)
    with pytest.raises(KeyError):
        comp.kind("nothing")


def test_constants_are_numpy_arrays_named_as_the_text_names_them():
    fb = dpl.FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 4))
    y = fb.emit("multiply", x, 0.5, name="y")
    z = fb.emit("add", y, dpl.const(np.arange(4, dtype="float32")), name="z")
    mod = dpl.Module([fb.ret(fb.emit("nn.softmax", z, axis=1, name="o"))])
    pats = dpl.parse_patterns("codegen t\npattern scale_shift {\n  y = multiply(x, s)\n  z = add(y, b)\n  out = nn.softmax(z)\n}\n")
    fused = dpl.apply(mod, pats)
    [wrapper] = [f for f in fused.functions.values() if "Codegen" in f.attrs]
    comp = read_composite(wrapper, fused)
    assert (comp.name, comp.prefix) == ("t.scale_shift", "t")
    assert [b.args for b in comp.bindings] == [("x", "y.0"), ("y", "c0"), ("z",)]
    assert "const c0: f32[4]" in fused.script()  # the name the text gives it
    assert set(comp.constants) == {"y.0", "c0"} and comp.kind("c0") == "constant"
    scalar, tensor = comp.constants["y.0"], comp.constants["c0"]
    assert isinstance(scalar, np.ndarray) and scalar.shape == () and scalar.dtype == np.float32 and scalar == 0.5
    np.testing.assert_array_equal(tensor, np.arange(4, dtype="float32"))
    assert not tensor.flags.writeable
    assert comp.binding("o").attrs == {"axis": 1}


def test_tuples_items_and_tuple_results():
    fb = dpl.FunctionBuilder("f", attrs={"Composite": "t.cat_split"})
    a, b = fb.param("a", "f32", (2, 3)), fb.param("b", "f32", (2, 3))
    c = fb.emit("concat", dpl.Tuple((a, b)), axis=0, name="c")
    s = fb.emit("split", c, indices_or_sections=2, axis=0, name="s")
    first = fb.item(s, 0, name="first")
    comp = read_composite(fb.ret(first, a))
    cat, split, item = comp.bindings
    assert cat.args == (("a", "b"),) and cat.attrs == {"axis": 0}
    assert (split.dtype, split.shape, split.fields) == (None, None, (("float32", (2, 3)), ("float32", (2, 3))))
    assert (item.op, item.args, item.attrs) == ("tuple_item", ("s",), {"index": 0})
    assert comp.outputs == ("first", "a")


def test_what_is_not_a_composite_says_so(llama):
    with pytest.raises(CompositeError, match="function 'fused_matmul_add' is not a composite: it is a fused group"):
        read_composite(llama["fused_matmul_add"], llama)
    with pytest.raises(CompositeError, match="function 'main' is not a composite: it is a plain function") as err:
        read_composite(llama["main"], llama)
    assert "Codegen wrappers" in err.value.hint
    with pytest.raises(CompositeError, match="which the module given does not hold") as err:
        read_composite(llama["fused_nn_rms_norm_kernel"])  # a wrapper needs its module
    assert "read_composite(function, module)" in err.value.hint
    assert issubclass(CompositeError, dpl.DplError)


def test_kernel_cache_is_public_and_import_dpl_stays_light():
    import dpl.backends
    from dpl.backends.cpu.toolchain import KernelCache

    assert dpl.backends.KernelCache is KernelCache
    probe = "import sys, dpl; print(sorted(m for m in sys.modules if m in ('dpl.backends.composite', 'dpl.backends.cpu.toolchain')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    with pytest.raises(AttributeError):
        dpl.backends.NoSuchThing  # noqa: B018


def test_the_example_plugin_reads_composites_through_the_public_api():
    for path in (EXAMPLE / "dpl_mylib").glob("*.py"):
        imports = re.findall(r"^\s*(?:from|import) (dpl\S*)", path.read_text(), re.M)
        assert set(imports) <= {"dpl.backends", "dpl_mylib.emit", "dpl_mylib.backend"}, (path.name, imports)
    assert 'dpl_mylib = ["*.dpl"]' in (EXAMPLE / "pyproject.toml").read_text()  # the library ships in the wheel


# -- the guide's Python, run as written ----------------------------------------------------------

SKIP = "<!-- not run by tests/test_backend_api.py"


def guide_blocks() -> list[tuple[int, str, str | None]]:
    """(line, code, expected output) of each ```python block of the guide not marked as not run;
    the expected output is the ```text block right after it, if any."""
    lines = GUIDE.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i] != "```python":
            i += 1
            continue
        end = lines.index("```", i + 1)
        marked = i > 0 and lines[i - 1].startswith(SKIP)
        code = "\n".join(lines[i + 1 : end]) + "\n"
        j = end + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        expected = None
        if j < len(lines) and lines[j] == "```text":
            expected = "\n".join(lines[j + 1 : lines.index("```", j + 1)]) + "\n"
        if not marked:
            blocks.append((i + 2, code, expected))
        i = end + 1
    return blocks


def test_the_guide_has_python_to_run():
    blocks = guide_blocks()
    assert len(blocks) >= 2 and any(expected for _, _, expected in blocks)
    assert any("read_composite" in code and "for b in composite.bindings" in code for _, code, _ in blocks)


@pytest.mark.parametrize("line, code, expected", guide_blocks(), ids=lambda v: f"L{v}" if isinstance(v, int) else "")
def test_the_guides_python_runs_as_written(line, code, expected, monkeypatch):
    monkeypatch.chdir(ROOT)  # its paths are the checkout's
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"{GUIDE.name}:{line}", "exec"), {"__name__": "guide"})
    if expected is not None:
        assert out.getvalue() == expected, textwrap.indent(out.getvalue(), "  ")
