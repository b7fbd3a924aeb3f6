"""The ``dpl`` command. Errors print a diagnostic and exit 1; an internal failure prints one
line asking for a bug report and exits 2; never a raw traceback."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from dpl.errors import DplError


def _llama_mlp():
    from dpl.ir import FunctionBuilder, Module

    fb = FunctionBuilder("main")
    x = fb.param("x", "f32", ("n", 64))
    w_gate = fb.param("w_gate", "f32", (64, 172))
    w_up = fb.param("w_up", "f32", (64, 172))
    w_down = fb.param("w_down", "f32", (172, 64))
    gate = fb.emit("matmul", x, w_gate, name="gate")
    act = fb.emit("nn.silu", gate, name="act")
    up = fb.emit("matmul", x, w_up, name="up")
    h = fb.emit("multiply", act, up, name="h")
    out = fb.emit("matmul", h, w_down, name="out")
    return Module([fb.ret(out)])


def random_inputs(fn, seed: int = 0, dims: dict[str, int] | None = None):
    """Random arrays for a function's parameters (symbolic dims default to 8)."""
    from dpl import dtypes
    from dpl.ir.types import TensorType

    rng = np.random.default_rng(seed)
    dims = dict(dims or {})
    arrays = []
    for p in fn.params:
        shape = tuple(dims.setdefault(d, 8) if isinstance(d, str) else d for d in p.ty.shape)
        try:
            TensorType(shape, p.ty.dtype)  # with the dims bound: within dpl.limits' shape sizes
        except DplError as err:
            raise DplError(f"input '{p.name}': {err.message}") from None
        dtype = dtypes.to_numpy(p.ty.dtype)
        if dtypes.is_float_numpy(dtype):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.random(shape) < 0.5)
        else:
            arrays.append(rng.integers(0, 4, shape).astype(dtype))
    return arrays


def _flatten(result) -> list:
    """The arrays of a result, nested tuples flattened in order."""
    if isinstance(result, tuple):
        return [a for r in result for a in _flatten(r)]
    return [result]


def _summarise(result) -> str:
    results = _flatten(result)
    lines = []
    for i, r in enumerate(results):
        lines.append(f"output {i}: shape {tuple(r.shape)} dtype {r.dtype} checksum {float(np.sum(r.astype(np.float64))):.6g}")
    return "\n".join(lines)


def cmd_print(args) -> int:
    from dpl.frontend import load_model as load

    print(load(args.file).script(), end="")
    return 0


def cmd_run(args) -> int:
    from dpl.frontend import load_model as load
    from dpl.interpret import interpret

    mod = load(args.file)
    if args.entry not in mod.functions:
        raise DplError(f"'{args.file}' has no function '{args.entry}' (it has: {', '.join(mod.functions)})")
    dims = dict(_dim(d) for d in args.dim)
    try:
        inputs = random_inputs(mod[args.entry], args.seed, dims)
    except MemoryError:
        raise DplError("not enough memory for random inputs of these sizes", hint="give smaller sizes with --dim") from None
    print(_summarise(interpret(mod, *inputs, entry=args.entry)))
    return 0


def _dim(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    if not name or not value.isdigit():
        raise DplError(f"--dim takes NAME=SIZE, got '{text}'")
    return name, int(value)


def cmd_check(args) -> int:
    from dpl.lang.tool import check_report

    print(check_report(args.files))
    return 0


def cmd_fuse(args) -> int:
    from dpl.apply import apply
    from dpl.frontend import load_model as load
    from dpl.trace import Trace

    mod = load(args.file)
    trace = Trace()
    fused = apply(mod, args.patterns or (), annotate_codegen=not args.no_codegen, fuse=not args.no_auto,
                  fuse_reductions=args.fuse_reductions, trace=trace)
    print(fused.script(), end="")
    if args.report:
        print("\n# report\n" + "\n".join(f"# {line}" for line in trace.report().splitlines()))
    return 0


def cmd_demo(args) -> int:
    from dpl.interpret import interpret

    mod = _llama_mlp()
    print(mod.script())
    print(_summarise(interpret(mod, *random_inputs(mod["main"], args.seed))))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpl", description="rewrite and fuse tensor-program graphs")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("print", help="parse and check a module file (or import an .onnx model), print it in canonical form")
    p.add_argument("file")
    p.set_defaults(func=cmd_print)
    p = sub.add_parser("run", help="run a module file or .onnx model on random inputs; print output shapes, dtypes, checksums")
    p.add_argument("file")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--entry", default="main")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE", help="size of a symbolic dimension (default 8)")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("check", help="validate .dpl pattern files (or shipped library names) and list their rules")
    p.add_argument("files", nargs="+")
    p.set_defaults(func=cmd_check)
    p = sub.add_parser("fuse", help="rewrite and fuse a module file or .onnx model with pattern files or libraries; print the result")
    p.add_argument("file")
    p.add_argument("--patterns", "-p", action="append", default=[], metavar="P",
                   help="a .dpl file or a shipped library (cublas, llm, rewrites); repeat it, earlier ones win")
    p.add_argument("--report", action="store_true", help="also print which matches were accepted or rejected, and why")
    p.add_argument("--no-codegen", action="store_true", help="leave composites unwrapped (no Codegen functions)")
    p.add_argument("--no-auto", action="store_true", help="skip automatic fusion of what no pattern claimed")
    p.add_argument("--fuse-reductions", action="store_true",
                   help="beyond TVM: also fuse row-wise chains (decomposed softmax, RMSNorm, LayerNorm) into one kernel")
    p.set_defaults(func=cmd_fuse)
    p = sub.add_parser("demo", help="build a Llama-style MLP block in Python, print it and run it")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_demo)
    from dpl.runtime.profiler import add_profile_command

    add_profile_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DplError as err:
        print(err, file=sys.stderr)
        return 1
    except Exception as err:  # a bug in dpl, not in the user's input
        print(f"dpl: internal error ({type(err).__name__}: {err}); please report it as a bug", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
