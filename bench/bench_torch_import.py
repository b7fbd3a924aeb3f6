"""How long importing a Llama decoder block from PyTorch takes, step by step, beside TVM 0.27's
``from_exported_program`` on the same exported program (when TVM is installed).

    python bench/bench_torch_import.py               # the test-sized block and a 1024-wide one
    python bench/bench_torch_import.py 2048 5632     # width and MLP width

Steps: ``torch.export.export``; dpl's decomposition (functional ATen, only unknown ops
decomposed); dpl's graph walk (translation, weights copied to NumPy, linear weights laid out
transposed); TVM's import, which runs torch's full core-ATen decomposition itself. A warm-up
import of a tiny block runs first, so torch's one-time costs are not counted.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_frontend_torch import LlamaBlock  # noqa: E402  (the block the tests compare with torch)

from dpl.frontend.torch_export import _functional  # noqa: E402
from dpl.frontend.torch_graph import GraphImporter  # noqa: E402
from dpl.frontend.torch_ops import ATEN_OPS  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def tvm_import(program):
    try:
        from tvm.relax.frontend.torch import from_exported_program
    except ImportError:
        return None
    _, seconds = timed(lambda: from_exported_program(program))
    return seconds


def bench(dim, hidden, heads=16, seq=128, report=True):
    torch.manual_seed(0)
    block = LlamaBlock(dim, min(heads, dim // 16), hidden).eval()
    x, mask = torch.randn(1, seq, dim), torch.full((seq, seq), float("-inf")).triu(1)
    program, t_export = timed(lambda: torch.export.export(block, (x, mask)))
    functional, t_decompose = timed(lambda: _functional(program, ATEN_OPS))
    importer = GraphImporter(functional, ATEN_OPS, bind_params=True, dim_names={}, name="main")
    (mod, _), t_walk = timed(importer.run)
    t_tvm = tvm_import(program)
    if not report:
        return
    params = sum(p.numel() for p in block.parameters())
    nodes = sum(1 for n in functional.graph.nodes if n.op == "call_function")
    total = t_decompose + t_walk
    tvm = f"{t_tvm * 1e3:9.0f} {t_tvm / total:8.2f}" if t_tvm else f"{'-':>9} {'-':>8}"
    print(f"{dim:>5} {hidden:>6} {params / 1e6:7.2f} {nodes:6d} {len(mod['main'].bindings):6d} {t_export * 1e3:9.0f} "
          f"{t_decompose * 1e3:9.0f} {t_walk * 1e3:9.0f} {total * 1e3:9.0f} {tvm}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", nargs="*", type=int, metavar="N", help="width and MLP width (default: 64 128, then 1024 2816)")
    shape = parser.parse_args().shape
    if shape and len(shape) != 2:
        parser.error("give a width and an MLP width, or nothing")
    shapes = [tuple(shape)] if shape else [(64, 128), (1024, 2816)]
    print(f"{'dim':>5} {'hidden':>6} {'Mparams':>7} {'nodes':>6} {'binds':>6} {'export ms':>9} {'decomp ms':>9} "
          f"{'walk ms':>9} {'dpl ms':>9} {'TVM ms':>9} {'TVM/dpl':>8}")
    bench(32, 64, report=False)  # torch's and TVM's first calls load and compile much; time what follows
    for dim, hidden in shapes:
        bench(dim, hidden)


if __name__ == "__main__":
    main()
