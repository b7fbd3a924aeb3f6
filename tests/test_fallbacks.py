"""Fall-backs are loud and true (issue 34, item 1): each way a unit can miss the backend meant
for it — the cuda target without CUDA, a backend whose compile() raises CompileError, a codegen
prefix no backend owns — is a warning naming each unit, shows in ``ran_on`` and
``fallbacks`` of ``dpl run --json`` and in ``exe.summary()``, and is an error under strict."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import dpl
from dpl.backends import Backend, Capabilities, CompileError, get_backend, unregister_backend
from dpl.cli import main
from dpl.cli.common import random_inputs
from dpl.runtime import FallbackError, check_target
from runtime_corpus import inputs_for, swiglu_group

MODULE = """\
func main(x: f32[n, 8], w: f32[8, 4], b: f32[4]) -> f32[n, 4] {
  y = matmul(x, w)
  z = add(y, b)
  out = nn.relu(z)
  return out
}
"""


def patterns(prefix: str) -> str:
    return f"codegen {prefix}\n\n## matmul + bias\npattern mm_bias {{\n  mm = matmul(x, w)\n  out = add(mm, b)\n}}\n"


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.ir").write_text(MODULE)
    (tmp_path / "failing.dpl").write_text(patterns("failing"))
    (tmp_path / "nobody.dpl").write_text(patterns("nobody"))
    return tmp_path


class Failing(Backend):
    """Owns prefix ``failing`` and claims Primitive groups; compiles nothing."""

    name = "failing"
    prefixes = ("failing",)
    capabilities = Capabilities(kinds=("primitive", "composite", "codegen"))

    def __init__(self):
        self.asked: list[str] = []

    def compile(self, function, *, module=None, shapes=()):
        self.asked.append(function.name)
        raise CompileError(f"failing cannot compile '{function.name}'")


@pytest.fixture
def failing():
    backend = dpl.register_codegen("failing", Failing())
    yield backend
    unregister_backend("failing")


@pytest.fixture
def no_cuda(monkeypatch):
    """The cupy backend as without CuPy, whatever this machine has installed."""
    monkeypatch.setattr(get_backend("cupy"), "available", lambda: (False, "CuPy is not installed"))


def fallback_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("dpl.runtime")]


def run_json(capsys, *args) -> tuple[int, dict | None, str]:
    code = main(["run", "m.ir", "--dim", "n=3", "--check", "--json", *args])
    out = capsys.readouterr()
    return code, (json.loads(out.out) if out.out else None), out.err


# -- the cuda target without CUDA -------------------------------------------------------------------


def test_cuda_without_cupy_is_said_once_up_front_by_the_library(no_cuda, caplog):
    mod = dpl.parse(MODULE)  # unfused: three single ops, each a unit that falls back
    with caplog.at_level(logging.WARNING, logger="dpl"):
        exe = dpl.build(mod, "cuda")
        args = random_inputs(mod["main"], 0, {"n": 3})
        for _ in range(3):
            np.testing.assert_allclose(exe(*args), dpl.interpret(mod, *args), rtol=1e-5, atol=1e-5)
    [warning] = [w for w in fallback_warnings(caplog) if "cupy" in w]  # one, for every unit and call
    assert warning.startswith("target cuda: cupy is unavailable: CuPy is not installed; ") and warning.endswith(" runs instead")
    assert len(exe.fallbacks) == 3 and all(f.skipped == "cupy" and f.runs_on in ("cpu", "numpy") for f in exe.fallbacks)
    assert set(exe.ran_on()) == {"op matmul", "op add", "op nn.relu"} and set(exe.ran_on().values()) <= {"cpu", "numpy"}
    with pytest.raises(FallbackError) as err:
        dpl.build(mod, "cuda", strict=True)
    assert "target cuda: cupy is unavailable: CuPy is not installed" in err.value.message


def test_check_target_says_nothing_for_an_available_target(no_cuda):
    assert check_target("numpy") is None
    assert check_target("cuda", name="cuda").startswith("target cuda: cupy is unavailable: CuPy is not installed")


def test_cuda_without_cupy_on_the_command_line(files, no_cuda, capsys):
    code, out, err = run_json(capsys, "--target", "cuda")
    assert code == 0
    assert err.count("dpl: warning: target cuda: cupy is unavailable: CuPy is not installed;") == 1, err
    assert out["target"] == "cuda" and out["check"]["ok"] is True
    assert out["ran_on"] and "cupy" not in " ".join(out["ran_on"].values())
    assert out["fallbacks"] and {f["asked"] for f in out["fallbacks"]} == {"cupy"}
    assert all(f["reason"] == "cupy is unavailable: CuPy is not installed" for f in out["fallbacks"])
    # said before any work: even a missing file comes after it
    assert main(["run", "missing.ir", "--target", "cuda"]) == 1
    err = capsys.readouterr().err
    assert err.index("cupy is unavailable") < err.index("missing.ir")
    code, out, err = run_json(capsys, "--target", "cuda", "--strict")
    assert code == 1 and out is None and "Traceback" not in err
    assert "error: target cuda: cupy is unavailable: CuPy is not installed; a strict build does not fall back" in err


def test_profile_strict_without_cupy_is_an_error(files, no_cuda, capsys):
    assert main(["profile", "m.ir", "--dim", "n=4", "--repeat", "1", "--target", "cuda", "--strict"]) == 1
    assert "error: target cuda: cupy is unavailable: CuPy is not installed" in capsys.readouterr().err
    assert main(["profile", "m.ir", "--dim", "n=4", "--repeat", "1", "--target", "cuda"]) == 0
    assert capsys.readouterr().err.count("cupy is unavailable") == 1


# -- a backend whose compile() raises CompileError ------------------------------------------------


def test_a_compile_error_on_the_command_line(files, failing, capsys):
    code, out, err = run_json(capsys, "-p", "failing.dpl", "--target", "numpy")
    assert code == 0 and failing.asked == ["fused_matmul_add_failing"]
    assert ("dpl: warning: fall-back: codegen 'failing' (fused_matmul_add_failing) runs on numpy instead of failing "
            "(failing failed to compile: failing cannot compile 'fused_matmul_add_failing')") in err
    assert out["ran_on"] == {"fused_matmul_add_failing": "numpy", "op nn.relu": "numpy"}
    assert out["fallbacks"] == [{"unit": "codegen 'failing' (fused_matmul_add_failing)", "asked": "failing", "ran_on": "numpy",
                                 "reason": "failing failed to compile: failing cannot compile 'fused_matmul_add_failing'"}]
    code, out, err = run_json(capsys, "-p", "failing.dpl", "--target", "numpy", "--strict")
    assert code == 1 and out is None and "Traceback" not in err
    assert ("error: strict build for target numpy: codegen 'failing' (fused_matmul_add_failing) would run on numpy instead of "
            "failing (failing failed to compile: failing cannot compile 'fused_matmul_add_failing')") in err


def test_a_group_that_fails_to_compile_runs_op_by_op_and_warns_once(failing, caplog):
    g = swiglu_group("n")
    fb = dpl.FunctionBuilder("main")
    a, b = fb.param("gate", "f32", ("n", 64)), fb.param("up", "f32", ("n", 64))
    mod = dpl.Module([fb.ret(fb.call(g, a, b)), g])
    config = dpl.FusionConfig(min_tensor_elements=1, min_nodes_for_fusion=1)
    exe = dpl.build(mod, ["failing", "numpy"], config=config)
    before = exe.summary()  # symbolic shapes: nothing compiled yet, and the summary says so
    assert "primitive function 'fused_silu_multiply'     -> failing (first choice); not compiled yet" in before
    assert "no plan yet" in before and "every unit so far runs on the backend meant for it" in before and "fall-back" not in before
    with caplog.at_level(logging.WARNING, logger="dpl"):
        for n in (2, 2, 2):
            args = inputs_for(mod, {"n": n})
            np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
    assert fallback_warnings(caplog) == [
        "fall-back: primitive function 'fused_silu_multiply' runs op by op instead of as one failing kernel "
        "(failing failed to compile: failing cannot compile 'fused_silu_multiply')"]
    after = exe.summary()
    assert "not compiled yet" not in after and "no plan yet" not in after
    assert "-> failing (first choice); op by op, by fall-back, where failing failed to compile it" in after
    assert "fall-backs: 1\n  primitive function 'fused_silu_multiply' runs op by op instead of as one failing kernel" in after
    assert exe.ran_on() == {"fused_silu_multiply": "op by op on numpy"}
    strict = dpl.build(mod, ["failing", "numpy"], config=config, strict=True)  # symbolic: the error comes at the first call
    for _ in range(2):  # and at every call after it: a strict Executable never runs the fall-back
        with pytest.raises(FallbackError) as err:
            strict(*inputs_for(mod, {"n": 2}))
        assert "primitive function 'fused_silu_multiply' would run op by op instead of as one failing kernel" in err.value.message
        assert "failing cannot compile 'fused_silu_multiply'" in err.value.message


# -- a codegen prefix no backend owns -------------------------------------------------------------


def test_an_unowned_prefix_on_the_command_line(files, capsys):
    code, out, err = run_json(capsys, "-p", "nobody.dpl", "--target", "numpy")
    assert code == 0
    assert ("dpl: warning: fall-back: codegen 'nobody' (fused_matmul_add_nobody) runs on numpy instead of nobody "
            "(nobody is not a registered backend: no backend owns codegen prefix 'nobody')") in err
    assert out["ran_on"]["fused_matmul_add_nobody"] == "numpy"
    assert [f["asked"] for f in out["fallbacks"]] == ["nobody"]
    code, out, err = run_json(capsys, "-p", "nobody.dpl", "--target", "numpy", "--strict")
    assert code == 1 and out is None
    assert "error: strict build for target numpy: codegen 'nobody' (fused_matmul_add_nobody) would run on numpy" in err
    assert "hint: register a backend for codegen prefix 'nobody' (dpl.register_codegen)" in err


def test_an_unowned_prefix_in_the_library(files, caplog):
    mod = dpl.apply(dpl.parse(MODULE), ["nobody.dpl"])
    with caplog.at_level(logging.WARNING, logger="dpl"):
        exe = dpl.build(mod, "numpy")
    assert fallback_warnings(caplog) == [
        "fall-back: codegen 'nobody' (fused_matmul_add_nobody) runs on numpy instead of nobody "
        "(nobody is not a registered backend: no backend owns codegen prefix 'nobody')"]
    assert exe.choices["fused_matmul_add_nobody"].by_fallback
    with pytest.raises(FallbackError, match="codegen 'nobody' .* would run on numpy instead of nobody"):
        dpl.build(mod, "numpy", strict=True)


# -- what is reported is what ran -----------------------------------------------------------------


def test_summary_is_the_same_before_and_after_the_first_call_of_a_static_module(failing):
    g = swiglu_group(8)
    fb = dpl.FunctionBuilder("main")
    a, b = fb.param("gate", "f32", (8, 64)), fb.param("up", "f32", (8, 64))
    mod = dpl.Module([fb.ret(fb.call(g, a, b)), g])
    exe = dpl.build(mod, ["failing", "numpy"], config=dpl.FusionConfig(min_tensor_elements=1, min_nodes_for_fusion=1))

    def steady(text):  # the thread choice's timings are measurements of the calls themselves
        return [line for line in text.splitlines() if not line.strip().startswith("threads:")]

    before = exe.summary()
    exe(*inputs_for(mod, {}))
    assert steady(exe.summary()) == steady(before)
    assert "not compiled yet" not in before and "fall-backs: 1" in before


def test_no_fallback_no_warning(caplog):
    mod = dpl.apply(dpl.parse(MODULE), [])
    with caplog.at_level(logging.WARNING, logger="dpl"):
        exe = dpl.build(mod, "numpy", strict=True)
        exe(*random_inputs(mod["main"], 0, {"n": 3}))
    assert fallback_warnings(caplog) == [] and exe.fallbacks == []
    assert exe.ran_on() == {"fused_matmul_add_nn_relu": "numpy"} and "every unit so far runs on the backend meant for it" in exe.summary()


def test_check_prints_the_bound_it_used(files, capsys):
    code, out, _ = run_json(capsys, "--target", "numpy")
    assert code == 0
    want = dpl.interpret(dpl.parse(MODULE), *random_inputs(dpl.parse(MODULE)["main"], 0, {"n": 3}))
    scale = max(1.0, float(np.abs(want).max()))
    [bound] = out["check"]["bounds"]
    assert bound == {"output": 0, "abs": pytest.approx(1e-4 * scale), "rtol": 1e-4}
    assert scale > 1  # else this test could not tell the scaled bound from the plain atol
    assert main(["run", "m.ir", "--dim", "n=3", "--target", "numpy", "--check"]) == 0
    text = capsys.readouterr().out
    assert f"(bound |got - want| <= {1e-4 * scale:.3g} + 0.0001 * |want|): ok" in text
    assert "check: target numpy (ran on numpy) vs the interpreter" in text


def wide_module(count: int) -> str:
    """``count`` independent matmul + bias pairs of different widths: one composite function
    each under mm_bias (equal ones would be one shared function)."""
    params = ", ".join(f"x{i}: f32[4, {8 + i}], w{i}: f32[{8 + i}, 4], b{i}: f32[4]" for i in range(count))
    body = "".join(f"  m{i} = matmul(x{i}, w{i})\n  o{i} = add(m{i}, b{i})\n" for i in range(count))
    outs = ", ".join(f"o{i}" for i in range(count))
    types = ", ".join(["f32[4, 4]"] * count)
    return f"func main({params}) -> ({types}) {{\n{body}  return ({outs})\n}}\n"


@pytest.mark.parametrize("count", [2, 12])
def test_every_unit_that_falls_back_is_named_even_for_one_reason(count, caplog):
    """Two composites with an unowned prefix: both are named (the fresh user saw only the
    first); past WARNED_PER_REASON, one line says where the rest are listed."""
    from dpl.runtime.executable import WARNED_PER_REASON

    fused = dpl.apply(dpl.parse(wide_module(count)), dpl.parse_patterns(patterns("nobody")))
    with caplog.at_level(logging.WARNING, logger="dpl"):
        exe = dpl.build(fused, "cpu")
    warned = fallback_warnings(caplog)
    assert len(exe.fallbacks) == count
    named = [f for f in exe.fallbacks if any(f.unit in w for w in warned)]
    assert len(named) == min(count, WARNED_PER_REASON)
    assert "prefix 'nobody'" in warned[0] and all("(the same reason)" in w for w in warned[1:min(count, WARNED_PER_REASON)])
    if count > WARNED_PER_REASON:
        assert warned[-1] == "fall-back: more units fall back from nobody for the same reason: exe.fallbacks (--json) lists them"
    assert len(warned) == min(count, WARNED_PER_REASON + 1)


def test_an_op_without_a_c_kernel_is_routed_not_fallen_back(caplog):
    """topk has no C kernel: the cpu target's next backend runs it, which is the target's order
    at work (no warning, and strict builds accept it), as for every op the kernel IR lacks."""
    mod = dpl.parse("func main(x: f32[n, 8]) -> f32[n, 2] {\n  e = exp(x)\n  t = topk(e, k=2)\n  v = t[0]\n"
                    "  out = add(v, 1.0)\n  return out\n}\n")
    x = np.random.default_rng(0).standard_normal((5, 8)).astype("float32")
    with caplog.at_level(logging.WARNING, logger="dpl"):
        exe = dpl.build(mod, "cpu", strict=True)
        got = exe(x)
    np.testing.assert_allclose(got, dpl.interpret(mod, x), rtol=1e-6, atol=1e-6)
    assert exe.fallbacks == [] and fallback_warnings(caplog) == []
    assert exe.ran_on().get("op topk") == "numpy"
    assert "numpy (cpu has no kernel for op topk)" in exe.summary()
