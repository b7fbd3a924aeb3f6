"""The fusion heuristics: each static rule, each profile branch, the margin's edge, and the
Executable consulting them per group and per concrete shape."""

import json

import numpy as np
import pytest

import dpl
from dpl.errors import DplError
from dpl.runtime import (
    SEED_FUSION_OPS, FusionConfig, FusionHeuristics, FusionScheduler, ProfileError, compatible_key, exact_key,
)
from dpl.backends import get_backend
from runtime_corpus import group, inputs_for, swiglu_group, symbolic

SWIGLU = swiglu_group("n")
BIG = [(64, 64), (64, 64)]  # 4096 elements per input
F32 = ["float32", "float32"]


def chain(n_ops, op="nn.relu"):
    def body(fb, x):
        for _ in range(n_ops):
            x = fb.emit(op, x)
        return x

    return group(f"chain{n_ops}", [("x", "f32", (64, 64))], body)


def decide(graph=SWIGLU, shapes=BIG, dtypes=F32, supported=None, profile=None, **cfg):
    h = FusionHeuristics(FusionConfig.seed(**cfg), profile=profile)
    return h.should_fuse(graph, shapes, dtypes, supported)


def write_profile(tmp_path, **tables):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(tables))
    return str(path)


# -- stage one: static rules ----------------------------------------------------------------------

def test_rule0_the_switch():
    d = decide(enable_fusion=False)
    assert not d and d.rule == "rule 0" and "disabled" in d.reason


def test_rule1_min_nodes():
    assert decide(chain(1), [(64, 64)], ["float32"]).rule == "rule 1"
    assert not decide(chain(1), [(64, 64)], ["float32"])
    assert decide(chain(2), [(64, 64)], ["float32"])  # exactly min_nodes_for_fusion
    assert decide(chain(2), [(64, 64)], ["float32"], min_nodes_for_fusion=3).rule == "rule 1"


def test_rule2_max_graph_size():
    assert decide(chain(10), [(64, 64)], ["float32"])  # exactly max_graph_size
    d = decide(chain(11), [(64, 64)], ["float32"])
    assert not d and d.rule == "rule 2" and "11 ops > max_graph_size 10" in d.reason


def test_rule3_min_elements_of_every_input():
    d = decide(shapes=[(64, 64), (1, 64)])
    assert not d and d.rule == "rule 3" and "input 'up' has 64 elements < min_tensor_elements 1024" in d.reason
    assert decide(shapes=[(16, 64), (16, 64)])  # exactly 1024
    assert decide(shapes=[(15, 64), (15, 64)]).rule == "rule 3"


def test_rule4_every_op_supported_by_the_backend():
    d = decide(supported={"nn.silu"})
    assert not d and d.rule == "rule 4" and "cannot fuse multiply" in d.reason
    assert decide(supported=SEED_FUSION_OPS)
    exp_group = group("g", [("x", "f32", (64, 64))], lambda fb, x: fb.emit("exp", fb.emit("nn.relu", x)))
    assert decide(exp_group, [(64, 64)], ["float32"], supported=SEED_FUSION_OPS).rule == "rule 4"


def test_rules_apply_in_order():
    d = decide(chain(1), [(1, 1)], ["float32"], enable_fusion=False, supported=set())
    assert d.rule == "rule 0"
    assert decide(chain(1), [(1, 1)], ["float32"], supported=set()).rule == "rule 1"


# -- stage two: the profile -----------------------------------------------------------------------

def test_the_exact_key_wins_over_the_compatible_key(tmp_path):
    key = exact_key(SWIGLU, BIG, F32)
    path = write_profile(tmp_path, single={"nn.silu": 1.0, "multiply": 1.0},
                         fused={key: 3.0, "nn.silu+multiply": 0.5})
    d = decide(profile_path=path)
    assert not d and d.rule == "profile: exact key" and "separate 2 ms <= fused 3 ms" in d.reason
    other = decide(shapes=[(32, 64), (32, 64)], profile_path=path)  # another shape: the compatible key
    assert other and other.rule == "profile: compatible key"


def test_the_compatible_key_is_the_op_names_joined():
    assert compatible_key(SWIGLU) == "nn.silu+multiply"
    assert compatible_key(chain(3)) == "nn.relu+nn.relu+nn.relu"


def test_compatible_key(tmp_path):
    path = write_profile(tmp_path, single={"nn.silu": 1.0, "multiply": 1.0}, fused={"nn.silu+multiply": 1.5})
    d = decide(profile_path=path)
    assert d and d.rule == "profile: compatible key" and "separate 2 ms > fused 1.5 ms" in d.reason


def test_a_per_shape_separate_time_wins_over_the_sum_of_singles(tmp_path):
    key = exact_key(SWIGLU, BIG, F32)
    path = write_profile(tmp_path, single={"nn.silu": 1.0, "multiply": 1.0}, fused={key: 1.0}, separate={key: 1.05})
    assert not decide(profile_path=path)  # 1.05 <= 1.0 * 1.1, although the singles sum to 2


@pytest.mark.parametrize("policy, fuse", [("fuse", True), ("no_fuse", False)])
def test_missing_fused_time_follows_the_policy(tmp_path, policy, fuse):
    path = write_profile(tmp_path, single={"nn.silu": 1.0, "multiply": 1.0}, fused={"nn.relu+exp": 1.0})
    d = decide(profile_path=path, profile_fallback=policy)
    assert bool(d) is fuse and d.rule == "profile: missing data" and "no fused time for 'nn.silu+multiply'" in d.reason


@pytest.mark.parametrize("policy, fuse", [("fuse", True), ("no_fuse", False)])
def test_missing_single_time_follows_the_policy(tmp_path, policy, fuse):
    path = write_profile(tmp_path, single={"nn.silu": 1.0}, fused={"nn.silu+multiply": 0.1})
    d = decide(profile_path=path, profile_fallback=policy)
    assert bool(d) is fuse and d.rule == "profile: missing data" and "no single time for multiply" in d.reason


@pytest.mark.parametrize("policy, fuse", [("fuse", True), ("no_fuse", False)])
def test_no_profile_file_follows_the_policy(policy, fuse):
    d = decide(profile_fallback=policy)
    assert bool(d) is fuse and "no profile file" in d.reason


@pytest.mark.parametrize("separate, fuse", [(5.0, False), (5.000001, True), (4.999999, False)])
def test_the_margins_edge_is_strict(tmp_path, separate, fuse):
    # fused 4 ms x (1 + 0.25) = 5 ms exactly (binary-exact numbers): fuse only when strictly slower apart
    path = write_profile(tmp_path, single={"nn.silu": separate / 2, "multiply": separate / 2}, fused={"nn.silu+multiply": 4.0})
    assert bool(decide(profile_path=path, margin=0.25)) is fuse


@pytest.mark.parametrize("silu, fuse", [(0.7, True), (0.6, False), (0.5, False)])
def test_the_default_margin(tmp_path, silu, fuse):
    # default margin 0.1, fused 1 ms: 0.6 + 0.5 == 1.1 == 1.0 * (1 + 0.1) as floats, so no fusion at the edge
    path = write_profile(tmp_path, single={"nn.silu": silu, "multiply": 0.5}, fused={"nn.silu+multiply": 1.0})
    assert bool(decide(profile_path=path)) is fuse


def test_exact_keys_differ_by_shape_dtype_and_structure_not_names():
    renamed = swiglu_group("n", name="another_name")
    assert exact_key(SWIGLU, BIG, F32) == exact_key(renamed, BIG, F32)
    assert exact_key(SWIGLU, BIG, F32) != exact_key(SWIGLU, [(32, 64), (32, 64)], F32)
    assert exact_key(SWIGLU, BIG, F32) != exact_key(SWIGLU, BIG, ["float16", "float16"])
    swapped = group("g", [("gate", "f32", ("n", 64)), ("up", "f32", ("n", 64))],
                    lambda fb, g, u: fb.emit("multiply", fb.emit("nn.silu", u), g))
    assert exact_key(SWIGLU, BIG, F32) != exact_key(swapped, BIG, F32)
    assert len(exact_key(SWIGLU, BIG, F32)) == 64  # a SHA-256 hex digest


def test_bad_profiles_and_configs_are_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match="is not JSON"):
        decide(profile_path=str(bad))
    bad.write_text(json.dumps({"single": {"nn.silu": "fast"}}))
    with pytest.raises(ProfileError, match="'single' must map names to times in milliseconds"):
        decide(profile_path=str(bad))
    with pytest.raises(ProfileError, match="cannot read profile"):
        decide(profile_path=str(tmp_path / "missing.json"))
    with pytest.raises(DplError, match="profile_fallback must be .model., .fuse. or .no_fuse."):
        FusionConfig(profile_fallback="maybe")


# -- the scheduler and the Executable ---------------------------------------------------------------

def test_dispatch_runs_fused_or_op_by_op_and_caches_kernels():
    numpy = get_backend("numpy")
    sched = FusionScheduler(FusionConfig.seed())
    g, u = inputs_for(symbolic(), {"n": 64})
    want = dpl.interpret(SWIGLU, g, u)
    np.testing.assert_array_equal(sched.dispatch(SWIGLU, [g, u], numpy), want)
    np.testing.assert_array_equal(sched.dispatch(SWIGLU, [g, u], numpy), want)
    assert (sched.cache.misses, sched.cache.hits, len(sched.cache)) == (1, 1, 1)
    small = [g[:2], u[:2]]  # rule 3: op by op, nothing compiled
    np.testing.assert_array_equal(sched.dispatch(SWIGLU, small, numpy), dpl.interpret(SWIGLU, *small))
    assert len(sched.cache) == 1


def test_the_executable_decides_per_group_and_per_shape(tmp_path, no_c_compiler):
    mod = symbolic()
    key64 = exact_key(mod["fused_silu_multiply"], [(64, 64), (64, 64)], F32)
    path = write_profile(tmp_path, single={"nn.silu": 1.0, "multiply": 1.0},
                         fused={key64: 5.0, "nn.silu+multiply": 1.0})
    exe = dpl.build(mod, "cpu", config=FusionConfig.seed(profile_path=path))
    for n in (64, 128):
        args = inputs_for(mod, {"n": n})
        np.testing.assert_array_equal(exe(*args), dpl.interpret(mod, *args))
    labels = {sig[0][0][0]: [s.label for s in plan.steps] for sig, plan in exe.plans.items()}
    assert labels[64] == ["op nn.silu", "op multiply", "op sum", "op subtract"]
    assert labels[128] == ["fused fused_silu_multiply", "op sum", "op subtract"]
    text = exe.summary()
    assert "at [64, 64] [64, 64]: do not fuse (profile: exact key: separate 2 ms <= fused 5 ms x (1 + 0.1)); runs op by op" in text
    assert "at [128, 64] [128, 64]: fuse (profile: compatible key: separate 2 ms > fused 1 ms x (1 + 0.1)); fused kernel compiled by numpy" in text


# -- the default: the traffic model (dpl.runtime.cost) ------------------------------------------------

def conv_bias_relu():
    def body(fb, x, w, b):
        y = fb.emit("nn.conv2d", x, w, padding=[1, 1, 1, 1])
        return fb.emit("nn.relu", fb.emit("add", y, b))

    return group("conv_bias_relu", [("x", "f32", (1, 64, 56, 56)), ("w", "f32", (64, 64, 3, 3)), ("b", "f32", (1, 64, 1, 1))], body)


def matmul_bias():
    return group("matmul_bias", [("x", "f32", (128, 256)), ("w", "f32", (256, 256)), ("b", "f32", (256,))],
                 lambda fb, x, w, b: fb.emit("add", fb.emit("matmul", x, w), b))


@pytest.mark.parametrize("make", [conv_bias_relu, matmul_bias])
def test_a_small_bias_keeps_a_group_fused_by_default(make):
    g = make()
    shapes = [p.ty.shape for p in g.params]
    d = FusionHeuristics(FusionConfig()).should_fuse(g, shapes, ["float32"] * len(shapes))
    assert d and d.rule == "model" and "no profile file" in d.reason
    seed = FusionHeuristics(FusionConfig.seed()).should_fuse(g, shapes, ["float32"] * len(shapes))
    assert not seed and seed.rule == "rule 3"  # the seed sent it op by op for the bias


def test_the_model_prices_bytes_calls_and_arithmetic():
    from dpl.runtime.cost import group_cost

    cost = group_cost(matmul_bias(), [(128, 256), (256, 256), (256,)])
    product, bias, x, w = 128 * 256 * 4, 256 * 4, 128 * 256 * 4, 256 * 256 * 4
    assert cost.calls_apart == 2 and cost.bytes_fused == x + w + bias + product
    assert cost.bytes_apart == (x + w + product) + (product + bias + product)
    assert cost.product_ops == 2 * 128 * 256 * 256 and cost.ops == 128 * 256
    assert cost.seconds(True) < cost.seconds(False)
    small = group_cost(SWIGLU, [(4, 64), (4, 64)])  # symbolic dims bound from the shapes
    assert small.bytes_fused == 3 * 4 * 64 * 4 and small.bytes_apart == 5 * 4 * 64 * 4


def test_profile_data_overrides_the_model_per_shape(tmp_path):
    key = exact_key(SWIGLU, BIG, F32)
    path = write_profile(tmp_path, fused={key: 3.0}, separate={key: 1.0})
    h = FusionHeuristics(FusionConfig(profile_path=path))
    d = h.should_fuse(SWIGLU, BIG, F32)
    assert not d and d.rule == "profile: exact key"
    other = h.should_fuse(SWIGLU, [(32, 64), (32, 64)], F32)  # not in the profile: the model
    assert other and other.rule == "model" and "no fused time" in other.reason


def test_seed_is_the_old_default():
    seed = FusionConfig.seed()
    assert (seed.max_graph_size, seed.min_tensor_elements, seed.profile_fallback, seed.min_nodes_for_fusion) == (10, 1024, "fuse", 2)
    assert FusionConfig.seed(margin=0.5).margin == 0.5 and FusionConfig.seed(margin=0.5).max_graph_size == 10


def test_constant_digests_are_remembered_per_array_and_follow_the_bytes():
    from dpl.runtime.keys import _DIGESTS, constant_digest

    a = np.arange(1000, dtype=np.float32)
    b = a.copy()
    b[999] = -1
    assert constant_digest(a) == constant_digest(a.copy()) != constant_digest(b)
    assert id(a) in _DIGESTS
    key = id(b)
    del b
    assert key not in _DIGESTS or _DIGESTS[key][0]() is not None  # gone with its array
