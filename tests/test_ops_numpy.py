"""Every op through the interpreter against NumPy written independently here."""

import math

import numpy as np
import pytest

import needs

import dpl
from dpl.ir import FunctionBuilder, Module
from dpl.ops import all_ops

rng = np.random.default_rng(1234)


def rand(*shape, dtype="float32"):
    return rng.standard_normal(shape).astype(dtype)


def pos(*shape):
    return (rng.random(shape) + 0.5).astype("float32")


def run_op(op, arrays, **attrs):
    """Build main(params) -> op(params, attrs) and interpret it."""
    fb = FunctionBuilder("main")
    params = []
    for i, a in enumerate(arrays):
        if isinstance(a, tuple):
            params.append(dpl.Tuple([fb.param(f"p{i}_{j}", str(x.dtype), x.shape) for j, x in enumerate(a)]))
        else:
            params.append(fb.param(f"p{i}", str(a.dtype), a.shape))
    out = fb.emit(op, *params, **attrs)
    flat = [x for a in arrays for x in (a if isinstance(a, tuple) else (a,))]
    return dpl.interpret(Module([fb.ret(out)]), *flat)


def np_erf(x):
    return np.vectorize(math.erf)(x.astype(np.float64))


def conv2d_direct(x, w, stride, pad, dil, groups):
    n, c, h, wd = x.shape
    o, ci, kh, kw = w.shape
    xp = np.zeros((n, c, h + 2 * pad, wd + 2 * pad))
    xp[:, :, pad : pad + h, pad : pad + wd] = x
    oh = (h + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * pad - dil * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for b in range(n):
        for oc in range(o):
            g = oc // og
            for i in range(oh):
                for j in range(ow):
                    acc = 0.0
                    for cc in range(ci):
                        for ki in range(kh):
                            for kj in range(kw):
                                acc += xp[b, g * ci + cc, i * stride + ki * dil, j * stride + kj * dil] * w[oc, cc, ki, kj]
                    out[b, oc, i, j] = acc
    return out


def max_pool_direct(x, k, s, pad):
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * pad, w + 2 * pad), -np.inf)
    xp[:, :, pad : pad + h, pad : pad + w] = x
    oh, ow = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[:, :, i, j] = xp[:, :, i * s : i * s + k, j * s : j * s + k].max(axis=(2, 3))
    return out


def avg_pool_direct(x, k, s, pad, include_pad):
    """Each window's mean, written out: padding taps count only when include_pad."""
    n, c, h, w = x.shape
    oh, ow = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * s - pad, j * s - pad
            rows = [r for r in range(r0, r0 + k) if 0 <= r < h]
            cols = [q for q in range(c0, c0 + k) if 0 <= q < w]
            total = x[:, :, rows][:, :, :, cols].astype(np.float64).sum(axis=(2, 3))
            out[:, :, i, j] = total / (k * k if include_pad else len(rows) * len(cols))
    return out


def adaptive_direct(x, oh, ow):
    """PyTorch's adaptive windows: [floor(i*H/OH), ceil((i+1)*H/OH))."""
    h, w = x.shape[2:]
    out = np.empty(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, r1 = math.floor(i * h / oh), math.ceil((i + 1) * h / oh)
            c0, c1 = math.floor(j * w / ow), math.ceil((j + 1) * w / ow)
            out[:, :, i, j] = x[:, :, r0:r1, c0:c1].astype(np.float64).mean(axis=(2, 3))
    return out


a34, b34, row4, col3 = rand(3, 4), rand(3, 4), rand(4), rand(3, 1)
p34 = pos(3, 4)
x2d, w2d = rand(5, 8), rand(8, 6)
x3d = rand(2, 3, 4)
TIES = np.array([[1, 3, 3], [2, 2, 2]], np.float32)
img, ker = rand(2, 4, 7, 7), rand(6, 2, 3, 3)
cond = rng.random((3, 4)) < 0.5
idx = np.array([[0, 2], [1, 1]], dtype="int64")

# op -> list of (arrays, attrs, expected)
CASES = {
    "add": [((a34, row4), {}, a34 + row4), ((col3, row4), {}, col3 + row4)],
    "subtract": [((a34, col3), {}, a34 - col3)],
    "multiply": [((a34, b34), {}, a34 * b34)],
    "divide": [((a34, p34), {}, a34 / p34)],
    "power": [((p34, b34), {}, p34.astype(np.float64) ** b34)],
    "maximum": [((a34, b34), {}, np.where(a34 > b34, a34, b34))],
    "minimum": [((a34, row4), {}, np.where(a34 < row4, a34, row4))],
    "equal": [((a34, a34), {}, np.ones((3, 4), bool))],
    "not_equal": [((a34, b34), {}, a34 != b34)],
    "less": [((a34, b34), {}, a34 < b34)],
    "less_equal": [((a34, row4), {}, a34 <= row4)],
    "greater": [((a34, b34), {}, a34 > b34)],
    "greater_equal": [((col3, row4), {}, col3 >= row4)],
    "exp": [((a34,), {}, np.exp(a34.astype(np.float64)))],
    "log": [((p34,), {}, np.log(p34.astype(np.float64)))],
    "sqrt": [((p34,), {}, np.sqrt(p34.astype(np.float64)))],
    "rsqrt": [((p34,), {}, 1 / np.sqrt(p34.astype(np.float64)))],
    "tanh": [((a34,), {}, np.tanh(a34.astype(np.float64)))],
    "sigmoid": [((a34,), {}, 1 / (1 + np.exp(-a34.astype(np.float64))))],
    "erf": [((a34,), {}, np_erf(a34))],
    "sin": [((a34,), {}, np.sin(a34.astype(np.float64)))],
    "cos": [((a34,), {}, np.cos(a34.astype(np.float64)))],
    "negative": [((a34,), {}, -a34)],
    "abs": [((a34,), {}, np.where(a34 < 0, -a34, a34))],
    "square": [((a34,), {}, a34 * a34)],
    "clip": [((a34,), {"min": -0.5, "max": 0.5}, np.minimum(np.maximum(a34, -0.5), 0.5))],
    "astype": [((a34,), {"dtype": "f16"}, a34.astype(np.float16)), ((a34 * 3,), {"dtype": "int32"}, np.trunc(a34 * 3).astype(np.int32))],
    "where": [((cond, a34, row4), {}, np.where(cond, a34, np.broadcast_to(row4, (3, 4))))],
    "nn.relu": [((a34,), {}, a34 * (a34 > 0))],
    "nn.gelu": [((a34,), {}, 0.5 * a34 * (1 + np_erf(a34 / math.sqrt(2))))],
    "nn.gelu_tanh": [((a34,), {}, 0.5 * a34 * (1 + np.tanh(0.7978845608028654 * (a34 + 0.044715 * a34.astype(np.float64) ** 3))))],
    "nn.silu": [((a34,), {}, a34 / (1 + np.exp(-a34.astype(np.float64))))],
    "matmul": [
        ((x2d, w2d), {}, np.einsum("ik,kj->ij", x2d.astype(np.float64), w2d)),
        ((rand(2, 5, 8), w2d), {}, None),  # batched, checked below against einsum
        ((rand(8), w2d), {}, None),
    ],
    "nn.softmax": [((x3d,), {"axis": 1}, np.exp(x3d) / np.exp(x3d).sum(axis=1, keepdims=True))],
    "nn.log_softmax": [((x3d,), {}, x3d - np.log(np.exp(x3d).sum(axis=-1, keepdims=True)))],
    "nn.rms_norm": [((x3d, row4), {"epsilon": 1e-6}, x3d / np.sqrt((x3d.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * row4)],
    "nn.layer_norm": [
        (
            (x3d, row4, rand(4)),
            {"epsilon": 1e-5},
            None,  # checked below
        )
    ],
    "nn.conv2d": [
        ((img, rand(6, 4, 3, 3)), {"padding": 1}, None),
        ((img, ker), {"strides": 2, "groups": 2, "dilation": 2}, None),
    ],
    "nn.max_pool2d": [((img,), {"pool_size": 3, "strides": 2, "padding": 1}, max_pool_direct(img, 3, 2, 1))],
    "nn.avg_pool2d": [
        ((img,), {"pool_size": 3, "strides": 2, "padding": 1}, avg_pool_direct(img, 3, 2, 1, False)),
        ((img,), {"pool_size": 3, "strides": 2, "padding": 1, "count_include_pad": True}, avg_pool_direct(img, 3, 2, 1, True)),
        ((img,), {"pool_size": 2, "strides": 2}, avg_pool_direct(img, 2, 2, 0, False)),
    ],
    "nn.adaptive_avg_pool2d": [
        ((img,), {"output_size": [3, 2]}, adaptive_direct(img, 3, 2)),
        ((img,), {"output_size": 1}, img.astype(np.float64).mean(axis=(2, 3), keepdims=True)),
        ((img,), {}, img),
    ],
    "sum": [((x3d,), {"axis": [1, 2]}, x3d.astype(np.float64).sum(axis=(1, 2))), ((x3d,), {"axis": [-1], "keepdims": True}, x3d.sum(-1, keepdims=True))],
    "prod": [((p34,), {"axis": [0]}, p34.astype(np.float64).prod(0))],
    "mean": [((x3d,), {"axis": [-1], "keepdims": True}, x3d.astype(np.float64).sum(-1, keepdims=True) / 4)],
    "variance": [((x3d,), {"axis": [1]}, ((x3d - x3d.mean(1, keepdims=True)) ** 2).mean(1))],
    "max": [((x3d,), {}, np.array(x3d.max()))],
    "min": [((x3d,), {"axis": [0]}, x3d.min(0))],
    "reshape": [((x3d,), {"shape": [6, -1]}, x3d.reshape(6, 4))],
    "permute_dims": [((x3d,), {"axes": [2, 0, 1]}, x3d.transpose(2, 0, 1)), ((x3d,), {}, x3d.transpose(2, 1, 0))],
    "concat": [(((a34, b34),), {"axis": 1}, np.hstack([a34, b34]))],
    "split": [((x2d,), {"indices_or_sections": [1, 3], "axis": 0}, (x2d[:1], x2d[1:3], x2d[3:])), ((x2d,), {"indices_or_sections": 2, "axis": 1}, (x2d[:, :4], x2d[:, 4:]))],
    "strided_slice": [((x3d,), {"axes": [2, 0], "begin": [1, 0], "end": [4, 2], "strides": [2, 1]}, x3d[0:2, :, 1:4:2])],
    "take": [((x2d, idx), {"axis": 0}, x2d[idx]), ((x2d, idx), {}, x2d.reshape(-1)[idx])],
    "broadcast_to": [((col3,), {"shape": [2, 3, 4]}, np.tile(col3, (2, 1, 4)))],
    "expand_dims": [((a34,), {"axis": [0, -1]}, a34[None, :, :, None])],
    "squeeze": [((rand(1, 3, 1),), {}, None)],
    "full": [((np.array(2.5, "float32"),), {"shape": [2, 3]}, 2.5 * np.ones((2, 3)))],
    "zeros": [((), {"shape": [2, 2], "dtype": "f16"}, np.zeros((2, 2), np.float16))],
    "ones": [((), {"shape": [3]}, np.ones(3, np.float32))],
    "arange": [
        ((), {"end": 5}, np.array([0, 1, 2, 3, 4], np.int64)),
        ((), {"start": 2, "end": -7, "step": -3}, np.array([2, -1, -4], np.int64)),
        ((), {"start": 0.5, "end": 2.0, "step": 0.5}, np.array([0.5, 1.0, 1.5], np.float32)),
        ((), {"end": 3, "dtype": "f16"}, np.array([0, 1, 2], np.float16)),
    ],
    "cumsum": [((x2d,), {"axis": 1}, np.cumsum(x2d, axis=1)),
               ((np.array([[1, 1, 0], [0, 1, 1]], np.int64),), {"axis": -1}, np.array([[1, 2, 2], [0, 1, 2]], np.int64))],
    "triu": [((x3d,), {}, x3d * (np.arange(4)[None, :] >= np.arange(3)[:, None])), ((a34,), {"k": 2}, None)],
    "tril": [((x3d,), {"k": -1}, x3d * (np.arange(4)[None, :] <= np.arange(3)[:, None] - 1)), ((a34,), {"k": 1}, None)],
    # remainders, roundings, elementwise functions and padding (tests/test_elementwise_padding.py compares them
    # with torch and ONNX)
    "mod": [((np.float32([5, -5, 5, -5, 6]), np.float32([3, 3, -3, -3, 3])), {}, np.float32([2, -2, 2, -2, 0])),
            ((np.int32([7, -7, 7, -7, 5]), np.int32([2, 2, -2, -2, 0])), {}, np.int32([1, -1, 1, -1, 0]))],
    "floor_mod": [((np.float32([5, -5, 5, -5, 6]), np.float32([3, 3, -3, -3, 3])), {}, np.float32([2, 1, -1, -2, 0])),
                  ((np.int32([7, -7, 7, -7, 5]), np.int32([2, 2, -2, -2, 0])), {}, np.int32([1, 1, -1, -1, 0]))],
    "floor": [((a34,), {}, np.floor(a34))],
    "ceil": [((a34,), {}, np.ceil(a34))],
    "round": [((np.float32([0.5, 1.5, 2.5, -0.5, -1.5, 0.4]),), {}, np.float32([0, 2, 2, -0.0, -2, 0]))],
    "trunc": [((a34 * 3,), {}, np.trunc(a34 * 3))],
    "sign": [((a34,), {}, np.sign(a34)), ((np.int8([-3, 0, 4]),), {}, np.int8([-1, 0, 1]))],
    "log1p": [((p34,), {}, np.log1p(p34.astype(np.float64)))],
    "expm1": [((a34,), {}, np.expm1(a34.astype(np.float64)))],
    "nn.softplus": [((a34 * 10,), {"beta": 2.0, "threshold": 5.0},
                     np.where(a34 * 20 > 5, a34 * 10, np.log1p(np.exp(a34.astype(np.float64) * 20)) / 2))],
    "nn.pad": [((x3d,), {"pad_width": [0, 0, 1, 2, 3, 0], "pad_value": 0.5}, np.pad(x3d, [(0, 0), (1, 2), (3, 0)], constant_values=0.5)),
               ((x3d,), {"pad_width": [1, 0, 2, 2, 0, 3], "pad_mode": "reflect"}, np.pad(x3d, [(1, 0), (2, 2), (0, 3)], "reflect")),
               ((x3d,), {"pad_width": [0, 1, 2, 0, 3, 3], "pad_mode": "replicate"}, np.pad(x3d, [(0, 1), (2, 0), (3, 3)], "edge")),
               ((x3d,), {"pad_width": [0, 0, 3, 1, 4, 5], "pad_mode": "circular"}, np.pad(x3d, [(0, 0), (3, 1), (4, 5)], "wrap")),
               ((x3d,), {"pad_width": [0, 0, -1, 1, 2, -3]}, np.pad(x3d[:, 1:, :1], [(0, 0), (0, 1), (2, 0)]))],
    # indexing (dpl/ops/indexing.py); tests/test_ops_indexing.py compares them with torch and ONNX
    "argmax": [((TIES,), {"axis": 1}, np.array([1, 0], np.int64)),
               ((TIES,), {"axis": 1, "select_last_index": True, "keepdims": True}, np.array([[2], [2]], np.int64))],
    "argmin": [((TIES,), {}, np.array(0, np.int64)), ((TIES[::-1].copy(),), {"axis": 0}, np.array([1, 0, 0], np.int64))],
    "sort": [((TIES,), {"descending": True}, (np.array([[3, 3, 1], [2, 2, 2]], np.float32),
                                              np.array([[1, 2, 0], [0, 1, 2]], np.int64)))],
    "topk": [((TIES,), {"k": 2, "largest": False}, (np.array([[1, 3], [2, 2]], np.float32),
                                                    np.array([[0, 1], [0, 1]], np.int64)))],
    "histc": [((np.array([0.0, 0.5, 1.0, 2.0, -0.1], np.float32),), {"bins": 2, "min": 0.0, "max": 1.0},
               np.array([1, 2], np.float32))],
    "gather_nd": [((a34, np.array([[2, 0], [0, -1]])), {}, np.array([a34[2, 0], a34[0, 3]]))],
    # the experts' grouped product (dpl/ops/experts.py): expert 1 owns no rows, row 4 none
    "grouped_matmul": [((x2d[:, :3].copy(), rand(3, 3, 2), np.array([2, 2, 4], np.int32)), {}, None)],
    "gather_elements": [((a34, np.array([[2, 0, 1, 1]])), {}, np.array([[a34[2, 0], a34[0, 1], a34[1, 2], a34[1, 3]]]))],
    "scatter_nd": [((np.zeros((3, 2), np.float32), np.array([[1], [1]]), np.ones((2, 2), np.float32)), {"reduction": "add"},
                    np.array([[0, 0], [2, 2], [0, 0]], np.float32))],
    "scatter_elements": [((np.zeros((2, 3), np.float32), np.array([[2, 2]]), np.array([[4.0, 5.0]], np.float32)),
                          {"axis": 1, "reduction": "max"}, np.array([[0, 0, 5], [0, 0, 0]], np.float32))],
    "index_put": [((np.zeros((2, 3), np.float32), (np.array([0, 0]),), np.array([1.0], np.float32)), {"accumulate": True},
                   np.array([[2, 2, 2], [0, 0, 0]], np.float32))],
    "slice_scatter": [((np.zeros((2, 4), np.float32), np.ones((2, 2), np.float32)), {"axes": [1], "begin": [0], "end": [4],
                                                                                   "strides": [2]},
                       np.array([[1, 0, 1, 0], [1, 0, 1, 0]], np.float32))],
    # interpolation, convolutions of other ranks, group norm (dpl/ops/image.py; tests/test_ops_vision.py has more)
    "image.resize": [
        ((np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2),),
         {"size": [4, 4], "coordinate_transformation_mode": "asymmetric", "rounding_method": "floor"},
         np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2).repeat(2, 2).repeat(2, 3)),
        ((np.array([[0, 3]], np.float32),), {"size": [4], "method": "linear", "coordinate_transformation_mode": "align_corners"},
         np.array([[0, 1, 2, 3]], np.float32)),
        ((np.full((1, 1, 3, 3), 5, np.float32),), {"size": [5, 4], "method": "cubic"}, np.full((1, 1, 5, 4), 5, np.float32)),
    ],
    "nn.conv1d": [((np.array([[[1, 2, 3, 4]]], np.float32), np.array([[[1, 0, -1]]], np.float32)), {},
                   np.array([[[-2, -2]]], np.float32))],
    "nn.conv3d": [((np.ones((1, 1, 2, 2, 2), np.float32), np.ones((1, 1, 2, 2, 2), np.float32)), {},
                   np.full((1, 1, 1, 1, 1), 8, np.float32))],
    "nn.conv1d_transpose": [((np.array([[[1, 2]]], np.float32), np.ones((1, 1, 3), np.float32)), {"strides": 2},
                             np.array([[[1, 1, 3, 2, 2]]], np.float32))],
    "nn.conv2d_transpose": [((np.ones((1, 1, 1, 1), np.float32), np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)), {},
                             np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2))],
    "nn.conv3d_transpose": [((np.full((1, 1, 1, 1, 1), 2, np.float32), np.ones((1, 1, 1, 1, 2), np.float32)), {},
                             np.full((1, 1, 1, 1, 2), 2, np.float32))],
    "nn.group_norm": [((np.array([[[1, 3], [5, 7]]], np.float32), np.ones(2, np.float32), np.zeros(2, np.float32)),
                       {"num_groups": 1, "epsilon": 0.0}, np.array([[[-3, -1], [1, 3]]], np.float32) / np.sqrt(5))],
}


def expected_for(op, arrays, attrs, expected):
    if expected is not None:
        return expected
    if op == "grouped_matmul":  # rows 0-1 by expert 0, 2-3 by expert 2, row 4 zero
        x, w, _ = arrays
        return np.concatenate([x[:2] @ w[0], x[2:4] @ w[2], np.zeros((1, w.shape[2]), np.float32)])
    if op == "matmul":
        a, b = arrays
        return np.einsum("...k,kj->...j", a.astype(np.float64), b)
    if op == "nn.layer_norm":
        x, g, b = arrays
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + attrs["epsilon"]) * g + b
    if op == "nn.conv2d":
        x, w = arrays
        return conv2d_direct(x, w, attrs.get("strides", 1), attrs.get("padding", 0), attrs.get("dilation", 1), attrs.get("groups", 1))
    if op == "squeeze":
        return arrays[0].reshape(3)
    if op in ("triu", "tril"):
        (x,), k = arrays, attrs["k"]
        keep = [[(j - i >= k) if op == "triu" else (j - i <= k) for j in range(x.shape[1])] for i in range(x.shape[0])]
        return np.where(keep, x, 0)
    raise AssertionError(op)


PARAMS = [pytest.param(op, i, id=f"{op}-{i}") for op, cases in CASES.items() for i in range(len(cases))]


@pytest.mark.parametrize("op,i", PARAMS)
def test_op_matches_numpy(op, i):
    arrays, attrs, expected = CASES[op][i]
    got = run_op(op, arrays, **attrs)
    want = expected_for(op, arrays, attrs, expected)
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        pairs = list(zip(got, want))
    else:
        pairs = [(got, want)]
    for g, w in pairs:
        w = np.asarray(w)
        assert g.shape == w.shape
        if g.dtype == bool or g.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w)
        else:
            tol = 2e-3 if g.dtype == np.float16 else 2e-5
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)


def test_every_registered_op_is_tested():
    assert sorted(all_ops()) == sorted(CASES)


def test_result_dtypes_follow_inputs():
    h = rand(3, 4).astype(np.float16)
    assert run_op("exp", (h,)).dtype == np.float16
    assert run_op("add", (h, h)).dtype == np.float16
    assert run_op("matmul", (h, rand(4, 2).astype(np.float16))).dtype == np.float16
    assert run_op("matmul", (x2d, w2d), out_dtype="f16").dtype == np.float16


def test_bfloat16_accumulates_as_a_float():
    """ml_dtypes' bfloat16 has NumPy kind 'V': a matmul once accumulated it in int64, truncating."""
    ml_dtypes = needs.package("ml_dtypes")
    a, b = rand(4, 8).astype(ml_dtypes.bfloat16), rand(8, 3).astype(ml_dtypes.bfloat16)
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = run_op("matmul", (a, b))
    assert got.dtype == a.dtype
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=1e-2, atol=1e-2)
    np.testing.assert_allclose(run_op("sum", (a,), axis=[-1]).astype(np.float64), a.astype(np.float64).sum(-1), rtol=1e-2, atol=1e-2)


# -- symbolic dims in attributes ---------------------------------------------------------------


def symbolic_slice(x_shape, **attrs):
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", x_shape)
    extra = [fb.param("t", "f32", ("T",))] if any(d == "T" for d in attrs.get("end", ())) else []
    return Module([fb.ret(fb.emit("strided_slice", x, **attrs))]), x, extra


@pytest.mark.parametrize("shape, attrs, n, want", [
    ((16, 3), dict(axes=[0], begin=[0], end=["T"]), 5, lambda x: x[:5]),  # a static buffer cut to a length
    (("n", 3), dict(axes=[0], begin=[0], end=["n"]), 6, lambda x: x),
    (("n", 3), dict(axes=[0], begin=[-2], end=[2**63 - 1]), 6, lambda x: x[-2:]),  # the last rows
    (("n", 3), dict(axes=[0], begin=[-3], end=["n"]), 6, lambda x: x[-3:]),
    (("n", 3), dict(axes=[0], begin=[-3], end=[-1]), 6, lambda x: x[-3:-1]),
    (("n", 3), dict(axes=[0], begin=[1], end=[3]), 6, lambda x: x[1:3]),
])
def test_slices_over_symbolic_dims(shape, attrs, n, want):
    mod, x, extra = symbolic_slice(shape, **attrs)
    data = rand(*(n if d == "n" else d for d in shape))
    args = [data] + ([rand(5)] if extra else [])
    np.testing.assert_array_equal(dpl.interpret(mod, *args), want(data))


@pytest.mark.parametrize("shape, attrs, short, message", [
    ((16, 3), dict(axes=[0], begin=[0], end=["T"]), dict(t=20), "T=20"),
    (("n", 3), dict(axes=[0], begin=[-4], end=[2**40]), dict(n=3), "n=3"),
])
def test_a_slice_beyond_its_dimension_is_an_error_not_a_shorter_tensor(shape, attrs, short, message):
    mod, x, extra = symbolic_slice(shape, **attrs)
    args = [rand(*(short.get("n") if d == "n" else d for d in shape))] + ([rand(short["t"])] if extra else [])
    with pytest.raises(dpl.errors.InterpretError, match=f"op 'strided_slice' at .*{message}.*assumes more of the symbolic"):
        dpl.interpret(mod, *args)


@pytest.mark.parametrize("attrs, length, want", [  # lengths that are expressions of n (dpl.ir.dims)
    (dict(axes=[0], begin=[1], end=["n"]), "n - 1", lambda x: x[1:]),
    (dict(axes=[0], begin=[0], end=[2**40], strides=[2]), "(n + 1) // 2", lambda x: x[::2]),
    (dict(axes=[0], begin=[1], end=[-1]), "n - 2", lambda x: x[1:-1]),
    (dict(axes=[0], begin=[1], end=[2**40], strides=[3]), "(n + 1) // 3", lambda x: x[1::3]),
])
def test_slices_whose_length_is_an_expression(attrs, length, want):
    mod, x, extra = symbolic_slice(("n", 3), **attrs)
    assert str(mod["main"].ret.ty) == f"f32[{length}, 3]"
    for n in (2, 5, 6, 7):
        data = rand(n, 3)
        np.testing.assert_array_equal(dpl.interpret(mod, data), want(data))


@pytest.mark.parametrize("attrs, message", [
    (dict(axes=[0], begin=[-2], end=[3]), "has a length that depends on n"),
    (dict(axes=[0], begin=[2**40], end=[0], strides=[-1]), "only a positive stride slices a symbolic dimension"),
])
def test_slices_whose_length_is_no_dimension_are_refused(attrs, message):
    with pytest.raises(dpl.errors.TypeInferenceError, match=message):
        symbolic_slice(("n", 3), **attrs)


def test_arange_to_a_symbolic_end_takes_its_length_from_an_input():
    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 2))
    r = fb.emit("arange", end="n")
    assert str(r.ty) == "i64[n]"
    mod = Module([fb.ret(r)])
    np.testing.assert_array_equal(dpl.interpret(mod, rand(6, 2)), np.arange(6))
    assert str(fb.emit("arange", start=1, end="n").ty) == "i64[max(n, 1) - 1]"  # none at n = 0, as range(1, 0)
    with pytest.raises(dpl.errors.TypeInferenceError, match="must have integer bounds and step"):
        fb.emit("arange", start=0.5, end="n")
    lonely = FunctionBuilder("main")
    with pytest.raises(dpl.errors.InterpretError, match="names the symbolic dimension 'm', which no input of 'main' binds"):
        dpl.interpret(Module([lonely.ret(lonely.emit("zeros", shape=["m"]))]))
