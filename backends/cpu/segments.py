"""A group with matrix products, cut into segments: each product for a BLAS library (NumPy's on
the CPU, cuBLAS through ``cupy.matmul`` on CUDA), each run of the other bindings between
products as one generated kernel (an epilogue, a prologue, attention's scale-mask-softmax).

:func:`segment` does the cutting; :func:`fold_epilogues` lets a library product take the bias
and residual adds and the activation, or the gated unit, that open the part after it; :func:`segment_runner` runs the steps on an
array module (``numpy`` or ``cupy``), writing a product that is a result straight into its
output.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import attrs
import numpy as np

from dpl import dtypes
from dpl.ir.dim_binding import bind_shapes, undetermined
from dpl.ir.expr import Binding, Call, Constant, Function, Tuple, Var
from dpl.ir.traverse import vars_in
from dpl.ir.types import TensorType
from dpl.ir.traverse import substitute
from dpl.kernel.ir import dim_symbols, dim_value
from dpl.ops.registry import get_op
from dpl.runtime.prepared import Address


class NotSegmentable(Exception):
    """An operand or result the segments cannot hold (tuples inside the group, shapes the
    inputs do not determine, a product of something other than variables and constants)."""


@attrs.frozen(eq=False)
class Product:
    """A product the library computes. ``epilogue``: what :func:`fold_epilogues` moved into it
    from the part after it, in order: ``("bias", array)`` (plus a constant of the result's last
    dim) and ``("residual",)`` (plus the last of ``args``, an array of the result's shape), then
    ``("act", op)`` (a unary activation of the registry); for an NCHW convolution, in place of the
    bias, ``("channel", op, value_first, values)`` steps (an elementwise op with one value per
    channel: an inference BatchNorm's subtract, multiply, multiply, add); or
    ``("glu", gate_first)`` alone: the product's two halves of its last dim, ``silu(gate) * up``
    (the gate the first half where ``gate_first``), so that ``var`` is half as wide as the
    product (a gated MLP's merged gate and up projections)."""

    var: Var
    args: tuple
    call: Call | None = None  # the binding's call, for products other than matmul
    epilogue: tuple = ()


@attrs.frozen(eq=False)
class Part:
    """A run of bindings as its own Primitive function; ``ins`` / ``outs`` are the group's
    variables it reads and the ones read after it. ``after_product``: it runs right after a
    product; ``feeds_result``: one of its outputs is a result of the group."""

    function: Function
    ins: tuple
    outs: tuple
    after_product: bool
    feeds_result: bool


def is_product(b: Binding) -> bool:
    return isinstance(b.value, Call) and b.value.op == "matmul"


def segment(function: Function, is_product: Callable[[Binding], bool] = is_product,
            starts_part: Callable[[Binding], bool] | None = None) -> list[Product | Part]:
    """The group's bindings as products and the parts between them, in order. ``is_product``
    says which bindings a library computes (a backend may add its own: the CPU's convolutions);
    ``starts_part`` which bindings begin a new part, the values before them written out (a pool:
    generated C would recompute its input's epilogue for every window)."""
    params = list(function.params)
    shapes = [p.ty.shape for p in params if isinstance(p.ty, TensorType)]
    known = {s for shape in shapes for d in shape for s in dim_symbols(d)} - set(undetermined(shapes))
    rets = list(vars_in(function.ret))
    if not isinstance(function.ret, (Var, Tuple)) or any(not isinstance(b.var.ty, TensorType) or
                                                         {s for d in b.var.ty.shape for s in dim_symbols(d)} - known
                                                         for b in function.bindings):
        raise NotSegmentable
    bindings = list(function.bindings)
    steps: list[Product | Part] = []
    i, after = 0, False
    while i < len(bindings):
        if is_product(bindings[i]):
            b = bindings[i]
            if not all(isinstance(x, (Var, Constant)) for x in b.value.args):
                raise NotSegmentable
            steps.append(Product(b.var, tuple(b.value.args), b.value))
            after, i = True, i + 1
            continue
        j = i
        while j < len(bindings) and not is_product(bindings[j]) and not (j > i and starts_part and starts_part(bindings[j])):
            j += 1
        run = bindings[i:j]
        later = {id(v) for b in bindings[j:] for v in vars_in(b.value)} | {id(v) for v in rets}
        bound = {id(b.var) for b in run}
        ins = list({id(v): v for b in run for v in vars_in(b.value) if id(v) not in bound}.values())
        outs = [b.var for b in run if id(b.var) in later]
        fresh = {id(v): Var(v.name, v.ty) for v in ins}
        part = Function(f"{function.name}_part{len(steps)}", tuple(fresh[id(v)] for v in ins),
                        tuple(Binding(b.var, substitute(b.value, fresh)) for b in run),
                        outs[0] if len(outs) == 1 else Tuple(tuple(outs)), {"Primitive": True})
        steps.append(Part(part, tuple(ins), tuple(outs), after, any(v is r for v in outs for r in rets)))
        i = j
    return steps


def fold_epilogues(steps: list, folds: Callable[[Product], bool], rets: Sequence[Var],
                   glu: Callable[[Product], bool] | None = None, acts: Sequence[str] = ()) -> list:
    """``steps`` with each product that ``folds`` accepts taking what opens the part after it:
    a constant bias over the last dim, then an array of the product's own type (a residual),
    then one of the activations ``acts``, views that keep the last dim allowed between them,
    each value consumed read nowhere else; or, where ``glu`` accepts the product, the gated
    unit (``silu`` of one half of the product's last dim times the other half). The library
    applies them as it stores the product (no pass of the part over its result to do it);
    what is left of the part stays a part, and an empty one goes."""
    out = list(steps)
    k = 0
    while k + 1 < len(out):
        step, nxt = out[k], out[k + 1]
        if isinstance(step, Product) and isinstance(nxt, Part) and not step.epilogue and folds(step):
            later = {id(v) for s in out[k + 2:] for v in (s.args if isinstance(s, Product) else s.ins) if isinstance(v, Var)}
            results = {id(v) for v in rets}
            folded = glu is not None and glu(step) and _fold_glu(step, nxt, later | results, results) or None
            folded = folded or _fold(step, nxt, later | results, results, frozenset(acts))
            if folded is not None:
                out[k:k + 2] = folded
        k += 1
    return out


def fold_pools(steps: list, folds: Callable[[Product, Product], bool], rets: Sequence[Var]) -> list:
    """``steps`` with each convolution that ``folds(conv, pool)`` accepts taking the max pool
    right after it (a product step of its own) as the last of its epilogue, where the pool reads
    the convolution's result and nothing else does (nor is it a result of the group): the
    library pools the rows it computes while they are in cache, and the convolution's whole
    result is never stored."""
    out = list(steps)
    results = {id(v) for v in rets}
    k = 0
    while k + 1 < len(out):
        conv, pool = out[k], out[k + 1]
        if (isinstance(conv, Product) and isinstance(pool, Product) and conv.call is not None and pool.call is not None
                and conv.call.op == "nn.conv2d" and pool.call.op == "nn.max_pool2d" and len(pool.args) == 1
                and pool.args[0] is conv.var and id(conv.var) not in results and folds(conv, pool)):
            later = [v for s in out[k + 2:] for v in (s.args if isinstance(s, Product) else s.ins)]
            if not any(v is conv.var for v in later):
                out[k:k + 2] = [Product(pool.var, conv.args, conv.call, (*conv.epilogue, ("pool", pool.call)))]
        k += 1
    return out


def _uses(function: Function, var) -> int:
    """How many times ``function``'s bindings and result read ``var``."""
    reads = [v for b in function.bindings for v in vars_in(b.value)] + list(vars_in(function.ret))
    return sum(v is var for v in reads)


def _is_in(var, values) -> bool:
    return any(v is var for v in values)


def _fold(product: Product, part: Part, later: set, results: set, acts: frozenset = frozenset()) -> list | None:
    fn = part.function
    if id(product.var) in later or any(v is product.var for v in part.outs):
        return None
    at = [i for i, v in enumerate(part.ins) if v is product.var]
    if len(at) != 1 or _uses(fn, fn.params[at[0]]) != 1:
        return None
    ty = product.var.ty
    axis = _channel_axis(product.call)
    per_channel = axis is not None
    current, args, epilogue, n = fn.params[at[0]], list(product.args), [], 0
    last = None  # (bindings taken, the value) at the last epilogue step: a view after it stays in the part
    for b in fn.bindings:
        value = b.value
        alone = n == 0 or (_uses(fn, current) == 1 and not _is_in(current, part.outs))
        if alone and _row_view(value, current, b.var.ty, ty):
            current, ty, n = b.var, b.var.ty, n + 1  # the same elements in the same order: the epilogue goes on
            continue
        if (alone and isinstance(value, Call) and value.op in acts and len(value.args) == 1 and value.args[0] is current
                and b.var.ty == ty):
            epilogue.append(("act", value.op))  # the last of an epilogue
            current, n = b.var, n + 1
            last = (n, current)
            break
        if epilogue and epilogue[-1][0] == "residual":  # after the residual only an activation
            break
        # per-channel steps open a convolution's epilogue (a residual ended the loop above), on its
        # own result: after a view the second axis need not be the channels
        step = (per_channel and alone and len(epilogue) < MAX_CHANNEL_STEPS and ty == product.var.ty
                and _channel_step(value, current, b.var.ty, ty, axis))
        if step:
            epilogue.append(step)
            current, n = b.var, n + 1
            last = (n, current)
            continue
        if not (alone and isinstance(value, Call) and value.op == "add" and len(value.args) == 2 and _is_in(current, value.args)
                and b.var.ty == ty):
            break
        other = value.args[1] if value.args[0] is current else value.args[0]
        if (not epilogue and not per_channel and isinstance(other, Constant) and other.value.dtype == dtypes.to_numpy(ty.dtype)
                and other.value.size == ty.shape[-1] and other.value.shape[-1:] == (ty.shape[-1],)):
            epilogue.append(("bias", other.value))
        elif isinstance(other, Var) and other.ty == ty and _is_in(other, fn.params) and other is not current:
            epilogue.append(("residual",))
            args.append(next(v for p, v in zip(fn.params, part.ins) if p is other))
        else:
            break
        current, n = b.var, n + 1
        last = (n, current)
    if last is None:
        return None
    n, current = last
    return _folded(Product(current, tuple(args), product.call, tuple(epilogue)), part, n, results)


MAX_CHANNEL_STEPS = 8  # per-channel steps a convolution's epilogue takes (an inference BatchNorm is four)
CHANNEL_OPS = ("add", "subtract", "multiply", "divide")


def _channel_axis(call) -> int | None:
    """The axis of a convolution's result that holds its channels (1 for NCHW, 3 for NHWC): its
    epilogue takes per-channel steps, not a bias over the last dim; None for any other call."""
    if not (isinstance(call, Call) and call.op == "nn.conv2d"):
        return None
    return {"NCHW": 1, "NHWC": 3}.get(call.attrs.get("data_layout", "NCHW"))


def _channel_step(value, current, ty, before, axis: int) -> tuple | None:
    """``("channel", op, value_first, values)`` where ``value`` combines ``current`` (a
    convolution's result of type ``before``, its channels on ``axis``) with a constant of one
    value per channel (or one value), keeping its type; None where it does not."""
    if not (isinstance(value, Call) and value.op in CHANNEL_OPS and len(value.args) == 2 and ty == before
            and _is_in(current, value.args) and not all(a is current for a in value.args)):
        return None
    other = value.args[1] if value.args[0] is current else value.args[0]
    if not isinstance(other, Constant) or other.value.dtype != dtypes.to_numpy(ty.dtype):
        return None
    c, shape = ty.shape[axis], other.value.shape
    if not isinstance(c, int) or len(shape) > len(ty.shape):
        return None
    lead = (1,) * (len(ty.shape) - len(shape)) + tuple(shape)  # aligned with the result's axes
    if not (all(d == 1 for i, d in enumerate(lead) if i != axis) and lead[axis] in (1, c)):
        return None
    return ("channel", value.op, value.args[0] is other, np.broadcast_to(other.value.reshape(-1), (c,)).copy())


def _row_view(value, current, ty, before) -> bool:
    """Whether ``value`` reshapes ``current`` (of type ``before``) to ``ty`` keeping the last
    dim (static shapes): it only splits or merges rows (GPT-2's Conv1D views its 2-D rows back
    to [batch, seq, n]), so a bias over the last dim, a residual read in the same order and an
    elementwise activation mean what they meant."""
    return (isinstance(value, Call) and value.op == "reshape" and value.args[0] is current and isinstance(ty, TensorType)
            and ty.dtype == before.dtype and all(isinstance(d, int) for d in (*ty.shape, *before.shape))
            and len(ty.shape) >= 1 and len(before.shape) >= 1 and ty.shape[-1] == before.shape[-1])


def _fold_glu(product: Product, part: Part, later: set, results: set) -> list | None:
    """:func:`fold_epilogues`'s gated unit: the part opens with the two halves of the product's
    last dim (two ``strided_slice`` calls, in either order), ``nn.silu`` of one and its product with
    the other, each value read once (the last may be an output)."""
    fn = part.function
    if id(product.var) in later or any(v is product.var for v in part.outs) or len(fn.bindings) < 4:
        return None
    at = [i for i, v in enumerate(part.ins) if v is product.var]
    if len(at) != 1 or _uses(fn, fn.params[at[0]]) != 2:
        return None
    p, ty = fn.params[at[0]], product.var.ty
    width = ty.shape[-1]
    if not (isinstance(width, int) and width % 2 == 0 and width > 0):
        return None
    half, rank = width // 2, len(ty.shape)
    first, second, act, mul = fn.bindings[:4]
    halves = {}
    for b in (first, second):
        v = b.value
        if not (isinstance(v, Call) and v.op == "strided_slice" and v.args[0] is p and _uses(fn, b.var) == 1
                and not _is_in(b.var, part.outs)):
            return None
        a = dict(v.attrs)
        if [x % rank for x in a["axes"]] != [rank - 1] or list(a.get("strides") or [1]) != [1]:
            return None
        begin, end = a["begin"][0], a["end"][0]
        if (begin, end) not in ((0, half), (half, width)):
            return None
        halves[begin] = b.var
    if len(halves) != 2:
        return None
    gate_of = act.value
    if not (isinstance(gate_of, Call) and gate_of.op == "nn.silu" and len(gate_of.args) == 1
            and any(gate_of.args[0] is v for v in halves.values()) and _uses(fn, act.var) == 1 and not _is_in(act.var, part.outs)):
        return None
    gate = gate_of.args[0]
    up = halves[half] if gate is halves[0] else halves[0]
    m = mul.value
    if not (isinstance(m, Call) and m.op == "multiply" and len(m.args) == 2
            and {id(m.args[0]), id(m.args[1])} == {id(act.var), id(up)} and mul.var.ty.shape[-1] == half):
        return None
    return _folded(Product(mul.var, product.args, product.call, (("glu", gate is halves[0]),)), part, 4, results)


def _folded(folded: Product, part: Part, n: int, results: set) -> list:
    """``folded`` and what is left of ``part`` after its first ``n`` bindings (no part when
    nothing is)."""
    fn, current = part.function, folded.var
    rest = fn.bindings[n:]
    outs = tuple(v for v in part.outs if v is not current)
    if not rest or not outs:
        return [folded]
    bound = {id(b.var) for b in rest}
    free = list({id(v): v for b in rest for v in vars_in(b.value) if id(v) not in bound}.values())
    group = {id(p): v for p, v in zip(fn.params, part.ins)}
    fresh = {id(v): Var(v.name, v.ty) for v in free}
    function = Function(fn.name, tuple(fresh[id(v)] for v in free), tuple(Binding(b.var, substitute(b.value, fresh)) for b in rest),
                        outs[0] if len(outs) == 1 else Tuple(outs), fn.attrs)
    return [folded, Part(function, tuple(group.get(id(v), v) for v in free), outs, True, any(id(v) in results for v in outs))]


def _glu(xp, full, gate_first: bool, out):
    """``silu(gate) * up`` of the halves of ``full``'s last dim into ``out``, as the generated
    C computes it (``g / (1 + exp(-g))``; an exp that overflows is inf, its silu -0)."""
    half = full.shape[-1] // 2
    gate, up = (full[..., :half], full[..., half:]) if gate_first else (full[..., half:], full[..., :half])
    with np.errstate(over="ignore"):
        act = gate / (1 + xp.exp(-gate))
    return xp.multiply(act, up, out=out)


def _shape(ty, dims) -> tuple[int, ...]:
    return tuple(dim_value(d, dims) for d in ty.shape)


SHAPES_KEPT = 64  # input shapes a segment runner keeps what they bind for


class _Dims(dict):
    """The dims one signature of input shapes binds, and the (shape, NumPy dtype) of each type
    met at them, worked out once: a call at shapes met before skips binding its inputs and
    evaluating its values' shapes (part of every call's Python, issue 31)."""

    def __init__(self, bound: dict[str, int]):
        super().__init__(bound)
        self._specs: dict[int, tuple] = {}

    def spec(self, ty) -> tuple[tuple[int, ...], np.dtype]:
        found = self._specs.get(id(ty))
        if found is None:  # types are the function's, which the runner keeps: an id is not reused
            found = self._specs[id(ty)] = (_shape(ty, self), dtypes.to_numpy(ty.dtype))
        return found


def segment_runner(function: Function, steps: Sequence[Product | Part], kernels: Sequence[Callable], xp,
                   products: Callable[[Product], Callable | None] | None = None, matmul: Callable | None = None,
                   scratch_per_shape: bool = False) -> Callable:
    """``run(inputs, outputs)`` over arrays of module ``xp``: each product by ``matmul`` (``xp.matmul``
    unless given; called as ``matmul(a, b, out=...)``) (its
    epilogue's adds after it) or, when ``products(step)`` gives a function, by ``fn(*args, out)``
    (the step's arguments, a residual last; it writes ``out`` and returns
    it; a function marked ``returns_own`` is given ``out=None`` where the product is not a result
    of the group, and returns an array of its own), each part by its kernel (``kernels`` in the
    order of the parts). ``scratch_per_shape``: each shape keeps its own scratch buffers (a
    captured CUDA graph holds their addresses, so another shape must not free them)."""
    matmul = xp.matmul if matmul is None else matmul
    params, rets = list(function.params), list(vars_in(function.ret))
    parts = iter(kernels)
    plan = [(s, None if isinstance(s, Product) else next(parts)) for s in steps]
    library = {} if products is None else {id(s): products(s) for s in steps if isinstance(s, Product) and s.call is not None}
    library = {k: fn for k, fn in library.items() if fn is not None}
    local = threading.local()

    def scratch(var, dims):
        """The buffer an intermediate value lives in, kept from call to call: attention's scores
        at 16 x 512 x 512 are 16 MB, and a fresh array each call paid its page faults (the
        whole segment 12.9 ms against 8.0 for its steps). Per thread; never a result."""
        buffers = local.__dict__.setdefault("buffers", {})
        shape, dtype = dims.spec(var.ty)
        key = (id(var), shape) if scratch_per_shape else id(var)
        buf = buffers.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = buffers[key] = xp.empty(shape, dtype)
        return buf

    constants: dict[int, object] = {}

    def constant(c):
        """A constant operand in ``xp``'s memory, copied there once (not at every call)."""
        found = constants.get(id(c))
        if found is None:
            found = constants[id(c)] = xp.asarray(c.value)
        return found

    def product(step: Product, env, dims, direct):
        operands = [env[id(x)] if isinstance(x, Var) else constant(x) for x in step.args]
        dtype = dims.spec(step.var.ty)[1]
        target = direct.get(id(step.var))
        fn = library.get(id(step))
        if fn is not None and getattr(fn, "returns_own", False) and target is None:
            env[id(step.var)] = fn(*operands, None)  # a library's own result array: no copy into scratch
            return
        if target is None or not target.flags.c_contiguous:
            target = scratch(step.var, dims)
        if fn is not None:
            env[id(step.var)] = fn(*operands, target)
            return
        a, b = operands[:2]
        if step.epilogue[:1] and step.epilogue[0][0] == "glu":  # the whole product, then silu(gate) * up into target
            env[id(step.var)] = _glu(xp, matmul(a, b).astype(dtype, copy=False), step.epilogue[0][1], target)
            return
        full = target
        if step.call is not None and tuple(target.shape) != dims.spec(step.call.ty)[0]:
            target = target.reshape(dims.spec(step.call.ty)[0])  # a view folded in: the product in its own shape
        if xp.result_type(a, b) == dtype:
            result = matmul(a, b, out=target)
        else:
            result = matmul(a, b).astype(dtype, copy=False)
        for kind, *value in step.epilogue:
            if kind == "act":
                with np.errstate(over="ignore", invalid="ignore"):
                    xp.copyto(result, get_op(value[0]).ref(result))
            elif kind == "channel":  # one value per channel of an NCHW result
                op, value_first, values = value
                c = xp.asarray(values).reshape(-1, *[1] * (result.ndim - 2))
                xp.copyto(result, getattr(xp, op)(c, result) if value_first else getattr(xp, op)(result, c))
            else:
                other = xp.asarray(value[0]) if kind == "bias" else operands[-1].reshape(result.shape)
                result = xp.add(result, other, out=result)
        env[id(step.var)] = full if result is target else result.reshape(full.shape)

    def part(step: Part, kernel, env, dims, direct):
        arrays = [direct.get(id(v)) for v in step.outs]
        arrays = [a if a is not None else scratch(v, dims) for a, v in zip(arrays, step.outs)]
        kernel([env[id(v)] for v in step.ins], arrays)
        env.update({id(v): a for v, a in zip(step.outs, arrays)})

    shapes_met: dict[tuple, _Dims] = {}  # by the inputs' shapes: what they bind, found once
    param_ids, ret_ids = [id(p) for p in params], [id(v) for v in rets]
    first_place: dict[int, int] = {}  # a result the group returns is written straight into its output (first place only)
    for k, v in enumerate(ret_ids):
        first_place.setdefault(v, k)

    def dims_at(key: tuple) -> _Dims:
        """What the inputs' shapes ``key`` bind."""
        dims = shapes_met.get(key)
        if dims is None:
            dims = _Dims(bind_shapes([(p.ty.shape, shape, f"input '{p.name}' of '{function.name}'")
                                      for p, shape in zip(params, key)]))
            if len(shapes_met) < SHAPES_KEPT:
                shapes_met[key] = dims
        return dims

    def run(inputs, outputs):
        env = dict(zip(param_ids, inputs))
        dims = dims_at(tuple(a.shape for a in inputs))
        direct = {v: outputs[k] for v, k in first_place.items()}
        for step, kernel in plan:
            if kernel is None:
                product(step, env, dims, direct)
            else:
                part(step, kernel, env, dims, direct)
        for k, v in enumerate(ret_ids):
            if env[v] is not outputs[k]:
                xp.copyto(outputs[k], env[v])

    def prepare(inputs, outputs):
        """The C calls of one run at these ``(ref, shape)`` of its inputs and outputs (the
        protocol of dpl.runtime.prepared): each product's and part's own, the values between them
        in scratch of the prepared call's own; None where a step has none (a NumPy product, an
        epilogue in NumPy) or a result needs a copy."""
        if xp is not np:
            return None
        dims = dims_at(tuple(shape for _, shape in inputs))
        env = {pid: ref for pid, (ref, _) in zip(param_ids, inputs)}
        direct = {v: outputs[k][0] for v, k in first_place.items()}
        calls = []

        def place(var):
            found = direct.get(id(var))
            return found if found is not None else Address.of(xp.empty(*dims.spec(var.ty)))

        def operand(x):
            if isinstance(x, Var):
                return env[id(x)], dims.spec(x.ty)[0]
            return Address.of(np.ascontiguousarray(constant(x))), tuple(x.value.shape)

        for step, kernel in plan:
            if kernel is None:
                fn = library.get(id(step))
                if fn is None or getattr(fn, "returns_own", False) or not callable(getattr(fn, "prepare", None)):
                    return None
                target = place(step.var)
                made = fn.prepare([operand(x) for x in step.args], [(target, dims.spec(step.var.ty)[0])])
                env[id(step.var)] = target
            else:
                if not callable(getattr(kernel, "prepare", None)):
                    return None
                targets = [place(v) for v in step.outs]
                made = kernel.prepare([operand(v) for v in step.ins], [(t, dims.spec(v.ty)[0]) for t, v in zip(targets, step.outs)])
                env.update({id(v): t for v, t in zip(step.outs, targets)})
            if made is None:
                return None
            calls.extend(made)
        if any(env[v] is not outputs[k][0] for k, v in enumerate(ret_ids)):
            return None  # a result passed through or returned twice: the general path copies it
        return calls

    def capped(n: int | None) -> Callable:
        """The same runner with each part and product that takes a cap (``with_threads``, the
        protocol of dpl.runtime.threads) capped at ``n`` threads; itself where none changes."""
        parts = [k.with_threads(n) if hasattr(k, "with_threads") else k for k in kernels]
        made = {i: fn.with_threads(n) if hasattr(fn, "with_threads") else fn for i, fn in library.items()}
        if all(a is b for a, b in zip(parts, kernels)) and all(made[i] is library[i] for i in made):
            return run
        return segment_runner(function, steps, parts, xp, products=lambda s: made.get(id(s)), matmul=matmul,
                              scratch_per_shape=scratch_per_shape)

    run.parts = list(kernels)  # type: ignore[attr-defined]
    run.products = list(library.values())  # type: ignore[attr-defined]  # the libraries' runners, in order
    run.prepare = prepare  # type: ignore[attr-defined]
    run.capped = capped  # type: ignore[attr-defined]
    return run
