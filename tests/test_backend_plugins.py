"""Backends from outside: a plugin installed by entry point (a real dist-info on sys.path, so
importlib.metadata finds it) that injects compile errors, and in-process register_codegen."""

import importlib
import sys
import textwrap

import numpy as np
import pytest

import dpl
import dpl.cli
from dpl.backends import Backend, Capabilities, backends, get_backend, load_plugins, unregister_backend
from dpl.runtime import FusionConfig, FusionError
from runtime_corpus import composite, group, inputs_for, swiglu_group

PLUGIN = '''
import numpy as np
from dpl.backends import Backend, Capabilities, CompileError
from dpl.interpret import run_function

COMPILED = []


class FailingBackend(Backend):
    """Claims Primitive groups and testplug.* composites, and fails to compile every one."""
    name = "testplug"
    prefixes = ("testplug",)
    capabilities = Capabilities(kinds=("primitive", "composite"), composites=("testplug.*",))

    def compile(self, function, *, module=None, shapes=()):
        COMPILED.append(function.name)
        raise CompileError(f"testplug cannot generate code for '{function.name}'")


class WorkingBackend(Backend):
    """Fuses groups of the seed's ops; its kernels count their calls."""
    name = "testplug_ok"
    capabilities = Capabilities(kinds=("primitive",), ops=("nn.silu", "multiply"))
    calls = 0

    def compile(self, function, *, module=None, shapes=()):
        def kernel(inputs, outputs):
            WorkingBackend.calls += 1
            np.copyto(outputs[0], run_function(module, function, list(inputs)))
        return kernel


def factory():
    return WorkingBackend()


PATTERNS = __import__("pathlib").Path(__file__).with_name("other.dpl")
'''

TESTLIB = """\
codegen testplug

## tanh of a sum
pattern add_tanh {
  s   = add(x, y)
  out = tanh(s)
}
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "dpl_testplug").mkdir()
    (root / "dpl_testplug" / "__init__.py").write_text(PLUGIN)
    (root / "dpl_testplug" / "testlib.dpl").write_text(TESTLIB)
    (root / "dpl_testplug" / "other.dpl").write_text(TESTLIB.replace("add_tanh", "add_tanh_too"))
    info = root / "dpl_testplug-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dpl-testplug\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent("""\
        [dpl.backends]
        testplug = dpl_testplug:FailingBackend
        testplug_ok = dpl_testplug:factory
        broken = dpl_testplug_missing:Nothing

        [dpl.patterns]
        testlib = dpl_testplug
        otherlib = dpl_testplug:PATTERNS
        cublas = dpl_testplug
        brokenlib = dpl_testplug_missing
        """))
    sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    errors = load_plugins(reload=True)
    yield sys.modules["dpl_testplug"], errors
    sys.path.remove(str(root))
    for name in ("testplug", "testplug_ok", "broken"):
        unregister_backend(name)
    sys.modules.pop("dpl_testplug", None)
    importlib.invalidate_caches()


def swiglu_module():
    g = swiglu_group(64)
    fb = dpl.FunctionBuilder("main")
    a, b = fb.param("gate", "f32", (64, 64)), fb.param("up", "f32", (64, 64))
    return dpl.Module([fb.ret(fb.emit("nn.relu", fb.call(g, a, b))), g])


def test_entry_point_plugins_are_registered(plugin):
    module, errors = plugin
    assert type(get_backend("testplug")) is module.FailingBackend
    assert type(get_backend("testplug_ok")) is module.WorkingBackend  # from a factory
    assert set(errors) == {"broken"}
    ok, why = get_backend("broken").available()
    assert not ok and "plugin 'broken' (dpl_testplug_missing:Nothing) failed to load: ModuleNotFoundError" in why


def test_a_compile_error_falls_back_to_running_the_group_op_by_op(plugin):
    module, _ = plugin
    mod = swiglu_module()
    exe = dpl.build(mod, ["testplug", "numpy"])
    assert "fused_silu_multiply" in module.COMPILED
    args = inputs_for(mod, {})
    np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
    assert [s.label for s in exe.plan(*args).steps] == ["op nn.silu", "op multiply", "op nn.relu"]
    text = exe.summary()
    assert ("primitive function 'fused_silu_multiply'     -> testplug (first choice); op by op, by fall-back, where testplug "
            "failed to compile it") in text
    assert ("compile error on testplug (testplug cannot generate code for 'fused_silu_multiply'); runs op by op") in text
    # testplug claims no single ops: the target's order, not a fall-back
    assert "op nn.silu" in text and "-> numpy (testplug runs no op functions)" in text
    [record] = [f for f in exe.fallbacks if f.runs_on == "op by op"]
    assert record.unit == "primitive function 'fused_silu_multiply'" and record.skipped == "testplug"
    assert record.reason == "failed to compile: testplug cannot generate code for 'fused_silu_multiply'"


def test_a_compile_error_raises_without_fallback_on_error(plugin):
    with pytest.raises(FusionError) as err:
        dpl.build(swiglu_module(), ["testplug", "numpy"], config=FusionConfig(fallback_on_error=False))
    assert "backend 'testplug' failed to compile group 'fused_silu_multiply'" in str(err.value)
    assert "fallback_on_error=True" in str(err.value)


def test_with_symbolic_shapes_the_error_comes_at_the_first_call(plugin):
    g = swiglu_group("n")
    fb = dpl.FunctionBuilder("main")
    a, b = fb.param("gate", "f32", ("n", 64)), fb.param("up", "f32", ("n", 64))
    mod = dpl.Module([fb.ret(fb.call(g, a, b)), g])
    exe = dpl.build(mod, ["testplug", "numpy"], config=FusionConfig.seed(fallback_on_error=False))
    exe(*inputs_for(mod, {"n": 2}))  # rule 3: not fused, nothing compiled
    with pytest.raises(FusionError):
        exe(*inputs_for(mod, {"n": 64}))


def test_a_composite_that_fails_to_compile_runs_on_the_next_backend(plugin):
    comp = group("f", [("x", "f32", (4, 4))], lambda fb, x: fb.emit("exp", x), attrs={"Primitive": True, "Composite": "testplug.exp"})
    fb = dpl.FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 4))
    mod = dpl.Module([fb.ret(fb.call(comp, x)), comp])
    exe = dpl.build(mod, ["testplug", "numpy"])
    args = inputs_for(mod, {})
    np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
    assert exe.choices["f"].backend.name == "numpy"
    failed = [f for f in exe.fallbacks if f.unit == "composite 'testplug.exp' (f)"]
    assert len(failed) == 1 and failed[0].skipped == "testplug" and failed[0].runs_on == "numpy"
    assert failed[0].reason == "failed to compile: testplug cannot generate code for 'f'"
    assert "numpy by fall-back (testplug failed to compile: testplug cannot generate code for 'f')" in exe.summary()


def test_a_working_plugin_runs_the_fused_kernel(plugin):
    module, _ = plugin
    mod = swiglu_module()
    before = module.WorkingBackend.calls
    exe = dpl.build(mod, ["testplug_ok", "numpy"])
    args = inputs_for(mod, {})
    np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
    assert module.WorkingBackend.calls == before + 1
    assert [s.backend for s in exe.plan(*args).steps] == ["testplug_ok", "numpy"]


def test_rule4_asks_the_chosen_backend(plugin):
    g = group("g", [("x", "f32", (64, 64))], lambda fb, x: fb.emit("exp", fb.emit("nn.silu", x)))
    fb = dpl.FunctionBuilder("main")
    x = fb.param("x", "f32", (64, 64))
    mod = dpl.Module([fb.ret(fb.call(g, x)), g])
    exe = dpl.build(mod, ["testplug_ok", "numpy"])
    # testplug_ok cannot even run the group (exp), so numpy, which fuses anything, takes it
    assert exe.choices["g"].backend.name == "numpy"
    assert "testplug_ok has no kernel for op exp" in exe.summary()


# -- in-process registration ---------------------------------------------------------------------

def test_register_codegen_claims_a_prefix_for_composites_and_codegen_wrappers():
    seen = []

    @dpl.register_codegen("mylib")
    class MyLib(Backend):
        name = "mylib"
        capabilities = Capabilities(kinds=("composite", "codegen"))

        def compile(self, function, *, module=None, shapes=()):
            seen.append((function.name, tuple(shapes)))
            return get_backend("numpy").compile(function, module=module, shapes=shapes)

    try:
        assert backends()["mylib"].prefixes == ("mylib",)
        comp = group("c", [("x", "f32", (4, 4))], lambda fb, x: fb.emit("tanh", x), attrs={"Primitive": True, "Composite": "mylib.tanh"})
        wrap = group("w", [("x", "f32", (4, 4))], lambda fb, x: fb.call(comp, x), attrs={"Codegen": "mylib", "global_symbol": "w"})
        fb = dpl.FunctionBuilder("main")
        x = fb.param("x", "f32", (4, 4))
        mod = dpl.Module([fb.ret(fb.call(wrap, fb.call(comp, x))), comp, wrap])
        exe = dpl.build(mod, ["mylib", "numpy"])
        args = inputs_for(mod, {})
        np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
        assert seen == [("c", ((4, 4),)), ("w", ((4, 4),))]
        assert {k: c.backend.name for k, c in exe.choices.items()} == {"c": "mylib", "w": "mylib"}
        # a target without mylib: the prefix still sends both to mylib (TVM's RunCodegen)
        exe = dpl.build(mod, "cpu")
        assert {k: c.backend.name for k, c in exe.choices.items()} == {"c": "mylib", "w": "mylib"}
        assert "codegen 'mylib' (w)" in exe.summary() and "-> mylib (owns codegen prefix 'mylib')" in exe.summary()
        np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
    finally:
        unregister_backend("mylib")


def test_register_codegen_on_a_plain_compile_function():
    @dpl.register_codegen("fnlib")
    def compile_fnlib(function, *, module=None, shapes=()):
        return get_backend("numpy").compile(function, module=module, shapes=shapes)

    try:
        comp = composite(codegen=False)
        comp = comp.with_function(dpl.ir.replace(comp["fused_matmul_add"], attrs={"Primitive": True, "Composite": "fnlib.mm"}))
        exe = dpl.build(comp, ["fnlib", "numpy"])
        assert exe.choices["fused_matmul_add"].backend.name == "fnlib"
    finally:
        unregister_backend("fnlib")


def test_register_codegen_checks_its_prefix():
    from dpl.backends import BackendError

    with pytest.raises(BackendError, match="a codegen prefix is a name without dots"):
        dpl.register_codegen("my.lib")
    with pytest.raises(BackendError, match="is neither a Backend nor a compile function"):
        dpl.register_codegen("lib", 42)


# -- the backend author's path: prefixes under any target, defaults, targets, precedence -------

def mylib_module(shape=(4, 4)):
    """main: tanh(x) through a mylib.tanh composite, then a single matmul op no composite claims."""
    comp = group("c", [("x", "f32", shape)], lambda fb, x: fb.emit("tanh", x), attrs={"Primitive": True, "Composite": "mylib.tanh"})
    fb = dpl.FunctionBuilder("main")
    x = fb.param("x", "f32", shape)
    return dpl.Module([fb.ret(fb.emit("matmul", fb.call(comp, x), x)), comp])


class Recording(Backend):
    """Owns prefix ``mylib`` with the default Capabilities; runs what it is handed by reference."""
    name = "mylib"
    prefixes = ("mylib",)

    def __init__(self, fail: bool = False):
        self.seen, self.fail = [], fail

    def compile(self, function, *, module=None, shapes=()):
        self.seen.append(function.name)
        if self.fail:
            raise dpl.backends.CompileError(f"mylib cannot compile '{function.name}'")
        return get_backend("numpy").compile(function, module=module, shapes=shapes)


@pytest.fixture
def mylib():
    backend = dpl.register_codegen("mylib", Recording())
    yield backend
    unregister_backend("mylib")


def test_default_capabilities_claim_only_the_own_prefix():
    b = Recording()
    mod = mylib_module()
    from dpl.backends import classify
    from dpl.backends.registry import Unit

    assert b.can_run(classify(mod["c"], mod)) == (True, "capable")
    other = classify(dpl.ir.replace(mod["c"], attrs={"Primitive": True, "Composite": "cublas.tanh"}), mod)
    assert b.can_run(other) == (False, "has no kernel for composite 'cublas.tanh'")
    op = Unit("op", "matmul", mod["main"], ("matmul",), frozenset({"float32"}))
    assert b.can_run(op) == (False, "runs no op functions")


@pytest.mark.parametrize("target", ["cpu", "numpy", "mylib,cpu", ["mylib", "cpu"], "mylib, numpy"])
def test_a_prefix_goes_to_its_backend_under_any_target(mylib, target):
    mod = mylib_module()
    exe = dpl.build(mod, target)
    args = inputs_for(mod, {})
    np.testing.assert_allclose(exe(*args), dpl.interpret(mod, *args), rtol=1e-6)
    assert exe.choices["c"].backend is mylib and mylib.seen == ["c"]  # handed its composite, never the lone matmul
    assert exe.choices["op matmul float32"].backend.name != "mylib"
    assert "composite 'mylib.tanh' (c)" in exe.summary() and "-> mylib (" in exe.summary()


def test_a_prefix_outside_the_target_is_listed_in_the_summary(mylib):
    text = dpl.build(mylib_module(), "numpy").summary()
    assert "mylib    available (owns codegen prefix 'mylib', outside the target)" in text
    assert "-> mylib (owns codegen prefix 'mylib')" in text


def test_a_prefix_backend_that_fails_falls_back_along_the_target_with_its_reason():
    failing = dpl.register_codegen("mylib", Recording(fail=True))
    try:
        mod = mylib_module()
        exe = dpl.build(mod, "cpu")
        args = inputs_for(mod, {})
        np.testing.assert_allclose(exe(*args), dpl.interpret(mod, *args), rtol=1e-6)
        assert failing.seen == ["c"] and exe.choices["c"].backend.name == "numpy"
        assert "-> numpy by fall-back (mylib failed to compile: mylib cannot compile 'c')\n" in exe.summary()
        assert "cpu has no kernel for composite" not in exe.summary()  # the target's order, not a reason
        [record] = [f for f in exe.fallbacks if f.skipped == "mylib"]
        assert record.unit == "composite 'mylib.tanh' (c)" and record.runs_on == "numpy"
    finally:
        unregister_backend("mylib")


def test_a_plugin_that_failed_to_load_says_so_for_its_prefix(plugin):
    comp = group("c", [("x", "f32", (4, 4))], lambda fb, x: fb.emit("exp", x), attrs={"Primitive": True, "Composite": "broken.exp"})
    fb = dpl.FunctionBuilder("main")
    x = fb.param("x", "f32", (4, 4))
    exe = dpl.build(dpl.Module([fb.ret(fb.call(comp, x)), comp]), "cpu")
    assert exe.choices["c"].backend.name == "numpy"
    assert "numpy by fall-back (broken is unavailable: plugin 'broken' (dpl_testplug_missing:Nothing) failed to load" in exe.summary()


def test_target_text_is_parsed_and_checked():
    from dpl.backends import BackendError, parse_target, resolve_target

    assert parse_target("mylib,cpu") == ("mylib", "cpu") and parse_target(" numpy ") == ("numpy",)
    assert [b.name for b in resolve_target("numpy-kernel,cpu")] == ["numpy-kernel", "numpy", "cpu"]
    for bad in ("", "mylib,,cpu", "cpu,"):
        with pytest.raises(BackendError, match="has an empty name"):
            resolve_target(bad)
    with pytest.raises(BackendError, match="unknown backend 'nolib'") as err:
        resolve_target("nolib,cpu")
    assert "named targets: numpy, cpu" in str(err.value)


def test_a_registration_that_replaces_another_is_logged(caplog):
    first = dpl.register_codegen("mylib", Recording())
    try:
        with caplog.at_level("WARNING", logger="dpl.backends.registry"):
            second = dpl.register_codegen("mylib", Recording())
        assert get_backend("mylib") is second and second is not first
        assert "backend 'mylib' (in-process) replaces the one registered before (in-process)" in caplog.text
    finally:
        unregister_backend("mylib")


def test_an_in_process_registration_wins_over_an_installed_plugin(plugin, caplog):
    module, _ = plugin
    mine = Recording()
    mine.name = "testplug_ok"
    dpl.backends.register_backend(mine)  # replaces the plugin loaded before (logged)
    try:
        caplog.clear()
        with caplog.at_level("WARNING", logger="dpl.backends.registry"):
            load_plugins(reload=True)
        assert get_backend("testplug_ok") is mine
        assert ("installed plugin testplug_ok (dpl_testplug:factory) is not used: backend 'testplug_ok' is registered "
                "in-process, which takes precedence") in caplog.text
        assert "replaces" not in caplog.text  # the other plugins loaded again replace nothing
    finally:
        unregister_backend("testplug_ok")
        load_plugins(reload=True)
    assert type(get_backend("testplug_ok")) is module.WorkingBackend


# -- pattern libraries installed by plugins (entry-point group dpl.patterns) -----------------------

def test_an_installed_pattern_library_is_found_by_name(plugin, capsys):
    from dpl.lang import library_names, load_rules
    from dpl.lang.tool import check_report

    assert [r.name for r in load_rules("testlib")] == ["testplug.add_tanh"]  # a package holding testlib.dpl
    [rule] = load_rules(["otherlib"])  # an object that is the file: errors and imports point at its path
    assert rule.name == "testplug.add_tanh_too" and rule.span.file.endswith("other.dpl")
    assert {"testlib", "otherlib"} <= set(library_names())
    assert "testplug.add_tanh" in check_report(["testlib"]) and "1 rule ok" in check_report(["testlib"])
    assert dpl.cli.main(["check", "testlib"]) == 0 and "codegen testplug" in capsys.readouterr().out


def test_an_installed_library_is_applied_and_its_composites_reach_their_backend(plugin):
    fb = dpl.FunctionBuilder("main")
    x, y = fb.param("x", "f32", (4, 4)), fb.param("y", "f32", (4, 4))
    mod = dpl.Module([fb.ret(fb.emit("tanh", fb.emit("add", x, y)))])
    fused = dpl.apply(mod, ["testlib"])
    assert {f.attrs.get("Codegen") for f in fused.functions.values()} >= {"testplug"}
    exe = dpl.build(fused, "cpu")  # testplug owns the prefix but runs no codegen wrappers: the target runs it
    args = inputs_for(mod, {})
    np.testing.assert_allclose(exe(*args), dpl.interpret(mod, *args), rtol=1e-6)
    assert ("codegen 'testplug' (fused_add_tanh_testplug) -> numpy by fall-back (testplug runs no codegen functions)\n"
            in exe.summary())
    assert "testplug available (owns codegen prefix 'testplug', outside the target)" in exe.summary()


def test_a_shipped_library_wins_and_a_broken_one_is_a_clear_error(plugin, caplog):
    from dpl.lang import PatternFileError, load_rules

    with caplog.at_level("WARNING", logger="dpl.lang.libraries"):
        assert all(r.name.startswith("cublas.") for r in load_rules("cublas"))
        load_rules("testlib")
    assert "installed pattern library 'cublas' (dpl_testplug) is not used: dpl ships a library of that name" in caplog.text
    with pytest.raises(PatternFileError, match=r"installed pattern library 'brokenlib' \(dpl_testplug_missing\) cannot be read: "
                                               r"ModuleNotFoundError"):
        load_rules("brokenlib")
    with pytest.raises(PatternFileError) as err:
        load_rules("nolib")
    assert "no shipped or installed pattern library 'nolib'" in str(err.value)
    assert "installed: brokenlib, otherlib, testlib" in str(err.value)
