"""Indexing, scattering and sorting (dpl/ops/indexing.py) through both frontends: each model is
compared with torch eager (torch.export path) and with ONNX's reference evaluator (the
torch.onnx dynamo export, and hand-built graphs), on the interpreter and on a strict "cpu"
build, on random inputs; a dynamic dim where the op allows one."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import needs

import dpl
from dpl.errors import DplError, TypeInferenceError
from dpl.ir import FunctionBuilder, Module

torch = needs.package("torch")
onnx = needs.package("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

rng = np.random.default_rng(7)


def randn(*shape):
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


def assert_same(got, want):
    got = got if isinstance(got, (tuple, list)) else (got,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# ops with no kernel lowering: alone, they run on the NumPy backend (a recorded fall-back)
OPAQUE = {"sort", "topk", "histc", "gather_nd", "gather_elements", "scatter_nd", "scatter_elements", "index_put",
          "slice_scatter", "take", "cumsum"}


def run_both(mod, inputs):
    """The interpreter's results, and a cpu build's, where every fused group compiles to C: only
    a lone opaque op may fall back to the NumPy backend."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        exe = dpl.build(dpl.apply(mod, ["rewrites", "llm", "cnn"]), "cpu", progress=False)
        out = exe(*inputs)
    elsewhere = {unit for unit, where in exe.ran_on().items() if not where.endswith("cpu")}
    assert all(unit.split()[0] == "op" and unit.split()[1] in OPAQUE for unit in elsewhere), exe.ran_on()
    return dpl.interpret(mod, *inputs), out


def torch_want(model, args):
    with torch.no_grad():
        out = model(*args)
    return [o.numpy() for o in (out if isinstance(out, (tuple, list)) else (out,))]


class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x, *rest):
        out = self.fn(x, *rest)
        return tuple(out) if isinstance(out, (tuple, list)) else out


def _setitem(x):
    y = x.clone()
    y[:, 1:3] = 1.5
    y[2] = x[0] * 2
    y[..., -1] += 3
    return y


def _put(x, i, v):
    y = x.clone()
    y[:, i] = v
    return y


def _put_acc(x, i, v):
    y = x.clone()
    y.index_put_((i,), v, accumulate=True)
    return y


def _mask(x):
    y = x.clone()
    y[x > 0.5] = -1.0
    return y


def _copy(x, s):
    y = x.clone()
    y.copy_(s)
    return y


def _rows():
    return torch.tensor([[0, 2, 5], [5, 1, 1], [3, 3, 0], [4, 0, 2]])


# (id, function of the inputs, example inputs, dynamic dims {input index: axis})
CASES = [
    ("argmax", lambda x: (x.argmax(), x.argmax(1, keepdim=True), x.argmin(-1), x.argmin(0)), (randn(5, 6),), {0: 0}),
    ("max-dim", lambda x: tuple(x.max(dim=1)) + tuple(x.min(dim=-1, keepdim=True)), (randn(5, 6),), {0: 0}),
    ("topk", lambda x: tuple(torch.topk(x, 3, dim=1)) + tuple(torch.topk(x, 2, dim=-1, largest=False)), (randn(5, 6),), {0: 0}),
    ("sort", lambda x: tuple(torch.sort(x, 1, descending=True)), (randn(5, 6),), {0: 0}),
    ("sort-stable", lambda x: tuple(torch.sort(x, stable=True)), (randn(5, 6),), {0: 0}),
    ("sort-dynamic-axis", lambda x: tuple(torch.sort(x, 0)), (randn(5, 6),), {0: 0}),
    ("histc", lambda x: torch.histc(x, 7, -1.5, 2.0), (randn(40),), {}),
    ("histc-data-range", lambda x: torch.histc(x, 5), (randn(40),), {}),
    ("setitem", _setitem, (randn(5, 6),), {}),
    ("index_put", lambda x, i, v: _put(x, i, v), (randn(5, 6), torch.tensor([0, -2]), randn(5, 2)), {0: 0, 2: 0}),
    ("index_put-accumulate", _put_acc, (randn(5, 6), torch.tensor([0, 2, 0]), randn(3, 6)), {}),
    # repeated indices adding values that broadcast (NumPy 2.4's add.at folds in only the values' own elements)
    ("index_put-accumulate-broadcast", _put_acc, (randn(5), torch.tensor([[1, 1], [-4, 1]]), randn(2)), {}),
    ("index_put-mask", _mask, (randn(5, 6),), {0: 0}),
    ("copy", _copy, (randn(5, 6), randn(6)), {0: 0}),
    ("index_copy", lambda x, i, v: x.index_copy(1, i, v), (randn(5, 6), torch.tensor([4, 1]), randn(5, 2)), {0: 0, 2: 0}),
    ("index_add", lambda x, i, v: x.index_add(0, i, v, alpha=2.0), (randn(5, 6), torch.tensor([1, 3, 1]), randn(3, 6)), {}),
    ("scatter", lambda x, i, v: (x.scatter(1, i, v), x.scatter(1, i, 2.5), x.scatter_add(1, i, v),
                                 x.scatter_reduce(1, i, v, "amax")), (randn(4, 6), _rows(), randn(4, 3)), {}),
    ("gather", lambda x, i: torch.gather(x, 1, i), (randn(4, 6), _rows()), {}),
    ("index-tuples", lambda x, i, j: x[i, j], (randn(5, 6), torch.tensor([[0], [3]]), torch.tensor([1, 5, -2])), {}),
]
# ops torch.onnx writes otherwise than in this family (histc has no ONNX form; index_copy and
# index_add it exports as ScatterND too, but through ops of other families)
# torch.onnx exports no histc nor stable sort; a mask write as NonZero (a data-dependent shape);
# copy_ of a broadcast source as an Identity whose declared shape is not its input's (the model is wrong)
NOT_ONNX = {"histc", "histc-data-range", "sort-stable", "index_put-mask", "copy"}
# shape arithmetic on the dynamic dim, which dpl's ONNX frontend cannot follow yet (dims that are
# expressions of symbols): x.argmax() flattens x, and a sort along the dynamic axis is a TopK whose
# k is that dim, reshaped as data
STATIC_ONNX = {"argmax", "sort-dynamic-axis"}


def _onnx_dims(cid, args, dims):
    """torch.onnx takes no dynamic shapes for forward(x, *rest): models of several inputs are static."""
    return {} if cid in STATIC_ONNX or len(args) > 1 else dims


def _dynamic(args, dims):
    if not dims:
        return None
    batch = torch.export.Dim("batch", min=2, max=64)
    specs = [{dims[i]: batch} if i in dims else None for i in range(len(args))]
    return (specs[0], tuple(specs[1:])) if len(args) > 1 else (specs[0],)  # forward(x, *rest)


@pytest.mark.parametrize("cid, fn, args, dims", CASES, ids=[c[0] for c in CASES])
def test_torch_path_matches_torch(cid, fn, args, dims):
    model = Fn(fn).eval()
    mod = dpl.from_torch(model, args, dynamic_shapes=_dynamic(args, dims))
    inputs = [a.numpy() for a in args]
    for got in run_both(mod, inputs):
        assert_same(got, torch_want(model, args))
    if dims:  # a second size along the dynamic dim
        bigger = [torch.cat([a, a[:1]], dims[i]) if i in dims else a for i, a in enumerate(args)]
        bigger = [b if b.dtype != torch.float32 else b + randn(*b.shape) for b in bigger]
        for got in run_both(mod, [b.numpy() for b in bigger]):
            assert_same(got, torch_want(model, bigger))


def _onnx_model(model, args, dims):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=_dynamic(args, dims), verbose=False)
    return program.model_proto


@pytest.mark.parametrize("cid, fn, args, dims", [c for c in CASES if c[0] not in NOT_ONNX],
                         ids=[c[0] for c in CASES if c[0] not in NOT_ONNX])
def test_onnx_path_matches_the_reference_evaluator(cid, fn, args, dims):
    proto = _onnx_model(Fn(fn).eval(), args, _onnx_dims(cid, args, dims))
    mod = dpl.from_onnx(proto)
    inputs = [a.numpy() for a in args]
    want = ReferenceEvaluator(proto).run(None, {i.name: a for i, a in zip(proto.graph.input, inputs)})
    for got in run_both(mod, inputs):
        assert_same(got, want)


def test_the_onnx_exports_use_this_familys_ops():
    """The differential tests above pass through ArgMax, TopK, ScatterND and ScatterElements."""
    seen = set()
    for cid, fn, args, dims in CASES:
        if cid not in NOT_ONNX:
            seen |= {n.op_type for n in _onnx_model(Fn(fn).eval(), args, _onnx_dims(cid, args, dims)).graph.node}
    assert {"ArgMax", "ArgMin", "TopK", "ScatterND", "ScatterElements", "GatherElements", "GatherND"} <= seen


# -- hand-built ONNX graphs --------------------------------------------------------------------


def _graph(node, inputs, outputs, initializers=(), opset=18):
    graph = helper.make_graph([node], "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _tensor(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _compare_onnx(model, feeds):
    mod = dpl.from_onnx(model)
    want = ReferenceEvaluator(model).run(None, feeds)
    for got in run_both(mod, list(feeds.values())):
        assert_same(got, want)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [dict(axis=1), dict(axis=-1, keepdims=0), dict(axis=0, select_last_index=1)])
def test_onnx_argmax_with_ties(op, attrs):
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    keep = attrs.get("keepdims", 1)
    axis = attrs["axis"] % 2
    shape = ["n", 6]
    out = [1 if a == axis else d for a, d in enumerate(shape)] if keep else [d for a, d in enumerate(shape) if a != axis]
    model = _graph(node, [_tensor("x", F, shape)], [_tensor("y", I64, out)])
    x = rng.integers(0, 3, (5, 6)).astype(np.float32)  # ties everywhere
    _compare_onnx(model, {"x": x})


@pytest.mark.parametrize("largest, ordered", [(1, 1), (0, 1), (1, 0)])
def test_onnx_topk_with_ties(largest, ordered):
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest, sorted=ordered)
    k = helper.make_tensor("k", I64, [1], [3])
    model = _graph(node, [_tensor("x", F, ["n", 6])], [_tensor("v", F, ["n", 3]), _tensor("i", I64, ["n", 3])], [k])
    x = rng.integers(0, 4, (5, 6)).astype(np.float32)
    mod = dpl.from_onnx(model)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for got in run_both(mod, [x]):
        assert_same(got[0], [want[0]])
        if ordered:  # the reference's unsorted order is its own; the values it picks are the same
            assert_same(got[1], [want[1]])


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_onnx_scatter_nd(reduction):
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)
    model = _graph(node, [_tensor("x", F, [5, "m"]), _tensor("i", I64, [3, 1]), _tensor("u", F, [3, "m"])],
                   [_tensor("y", F, [5, "m"])])
    feeds = {"x": rng.standard_normal((5, 4)).astype(np.float32), "i": np.array([[4], [0], [-2]]),
             "u": rng.standard_normal((3, 4)).astype(np.float32)}
    _compare_onnx(model, feeds)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, -1])
def test_onnx_scatter_elements(reduction, axis):
    node = helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis, reduction=reduction)
    model = _graph(node, [_tensor("x", F, [4, 5]), _tensor("i", I64, [2, 3]), _tensor("u", F, [2, 3])],
                   [_tensor("y", F, [4, 5])])
    feeds = {"x": rng.standard_normal((4, 5)).astype(np.float32), "i": rng.integers(-4, 4, (2, 3)),
             "u": rng.standard_normal((2, 3)).astype(np.float32)}
    _compare_onnx(model, feeds)


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_onnx_general_gather_nd(batch_dims):
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)
    out = ["n", 2, 5]  # indices' leading axes, then data's axes after the batch and the tuple
    model = _graph(node, [_tensor("x", F, ["n", 4, 5]), _tensor("i", I64, ["n", 2, 2 - batch_dims])],
                   [_tensor("y", F, out)])
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    i = rng.integers(-3, 3, (3, 2, 2 - batch_dims))
    _compare_onnx(model, {"x": x, "i": i})


def test_onnx_gather_elements_with_indices_along_every_axis():
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    model = _graph(node, [_tensor("x", F, ["n", 5]), _tensor("i", I64, ["n", 3])], [_tensor("y", F, ["n", 3])])
    _compare_onnx(model, {"x": rng.standard_normal((4, 5)).astype(np.float32), "i": rng.integers(-5, 5, (4, 3))})


def test_onnx_errors_in_a_translation_name_the_source_line():
    """A translation's refusal names the user's line as the unsupported-op error does."""
    node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="mean")
    helper.set_metadata_props(node, {"pkg.torch.onnx.stack_trace": f'File "{__file__}", line 3, in <module>\n'})
    model = _graph(node, [_tensor("x", F, [5, 4]), _tensor("i", I64, [3, 1]), _tensor("u", F, [3, 4])],
                   [_tensor("y", F, [5, 4])], opset=16)
    with pytest.raises(DplError, match=r"reduction='mean' is not supported.*test_ops_indexing.py:3: "):
        dpl.from_onnx(model)


# -- relative-position tables (Swin, DeBERTa) --------------------------------------------------


class SwinBias(torch.nn.Module):
    """Swin's relative position bias: an index table built from meshgrid'd ranges indexes a
    parameter table (here built in forward, as a traced model may)."""

    def __init__(self, window=3, heads=2):
        super().__init__()
        self.window = window
        self.table = torch.nn.Parameter(torch.randn((2 * window - 1) ** 2, heads))

    def forward(self, scores):
        w = self.window
        coords = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (w - 1)
        index = rel[..., 0] * (2 * w - 1) + rel[..., 1]
        bias = self.table[index.reshape(-1)].reshape(w * w, w * w, -1).permute(2, 0, 1)
        return scores + bias


class DebertaC2P(torch.nn.Module):
    """DeBERTa's content-to-position scores: relative distances clamped into buckets, gathered
    from each query's row of position scores with torch.gather."""

    def forward(self, c2p):
        n, span = c2p.shape[-2], c2p.shape[-1] // 2
        rel = torch.arange(n)[:, None] - torch.arange(n)[None, :]
        index = torch.clamp(rel + span, 0, 2 * span - 1)
        return torch.gather(c2p, -1, index.expand(c2p.shape[0], n, n))


@pytest.mark.parametrize("model, shape", [(SwinBias(), (4, 2, 9, 9)), (DebertaC2P(), (2, 6, 8))],
                         ids=["swin", "deberta"])
def test_relative_position_tables_import_both_ways(model, shape):
    x = randn(*shape)
    model = model.eval()
    want = torch_want(model, (x,))
    for got in run_both(dpl.from_torch(model, (x,)), [x.numpy()]):
        assert_same(got, want)
    proto = _onnx_model(model, (x,), {})
    for got in run_both(dpl.from_onnx(proto), [x.numpy()]):
        assert_same(got, want)


# -- semantics the frontends rely on -----------------------------------------------------------


def _call(op, *arrays, **attrs):
    fb = FunctionBuilder("main")
    params = [fb.param(f"p{i}", str(a.dtype), a.shape) for i, a in enumerate(arrays)]
    return dpl.interpret(Module([fb.ret(fb.emit(op, *params, **attrs))]), *arrays)


def test_nan_is_the_largest_value_as_in_torch():
    x = torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [2.0, 0.0, -1.0, 5.0]])
    a = x.numpy()
    assert_same(_call("argmax", a, axis=1), [x.argmax(1).numpy()])
    assert_same(_call("argmin", a, axis=1), [x.argmin(1).numpy()])
    assert_same(_call("sort", a, descending=True), list(map(torch.Tensor.numpy, torch.sort(x, descending=True, stable=True))))
    assert_same(_call("topk", a, k=2, largest=False), list(map(torch.Tensor.numpy, torch.topk(x, 2, largest=False))))


def test_argmax_lowers_to_one_kernel_with_its_epilogue():
    """OutEWiseFusable, as TVM: the index feeds an elementwise consumer in the same kernel."""
    from dpl.kernel import evaluate, lower_function

    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 6))
    fn = fb.ret(fb.emit("add", fb.emit("argmax", fb.emit("exp", x), axis=1, select_last_index=True), dpl.ir.const(1, "i64")))
    a = rng.integers(0, 3, (5, 6)).astype(np.float32)
    a[1, 2] = np.nan
    assert_same(evaluate(lower_function(fn), a), [dpl.interpret(Module([fn]), a)])


def test_histc_counts_as_torch_at_the_edges():
    x = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.7, 1.0, 1.0, -0.0, 1.0000001, -1e-9])
    for bins, lo, hi in [(10, 0.0, 1.0), (3, 0.0, 1.0), (4, 0.0, 0.0)]:
        assert_same(_call("histc", x.numpy(), bins=bins, min=lo, max=hi), [torch.histc(x, bins, lo, hi).numpy()])


def test_out_of_range_indices_are_errors_not_wrapped_reads():
    with pytest.raises(DplError, match="'gather_elements': index 6 is out of range for axis 1 of size 6"):
        _call("gather_elements", np.zeros((2, 6), np.float32), np.array([[0, 6]]), axis=1)


@pytest.mark.parametrize("op, shapes, attrs, message", [
    ("argmax", [(3, 0)], dict(axis=1), "op 'argmax': 'argmax' over axis 1 of p0: f32[3, 0], which has length 0"),
    ("topk", [(3, 4)], dict(k=5), "op 'topk': k=5 is out of range for axis 1"),
    ("histc", [(3, 4, "int64")], {}, "op 'histc': operand p0: i64[3, 4] must have a floating-point dtype"),
    ("scatter_nd", [(4, 5), (2, 1, "int64"), (2, 4)], {}, "op 'scatter_nd': updates p2: f32[2, 4] must have shape [2, 5]"),
    # a write into x[1:] of a dynamic n: the slice's length is n - 1, which the source must have
    ("slice_scatter", [("n", 4), ("n", 2)], dict(axes=[0], begin=[1], end=[2**63 - 1]),
     "op 'slice_scatter': source p1: f32[n, 2] must have the shape [n - 1, 4] of the slice it is written to"),
    ("gather_nd", [(4, 5), (2, 3, "int64")], {}, "op 'gather_nd': index tuples of length 3 after 0 batch axes"),
])
def test_type_errors_name_the_op(op, shapes, attrs, message):
    fb = FunctionBuilder("main")
    params = [fb.param(f"p{i}", s[-1] if isinstance(s[-1], str) and s[-1].startswith("int") else "f32",
                       tuple(d for d in s if not (isinstance(d, str) and d.startswith("int")))) for i, s in enumerate(shapes)]
    with pytest.raises(TypeInferenceError, match=re.escape(message)):
        fb.emit(op, *params, **attrs)
