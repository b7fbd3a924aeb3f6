"""Import speed on the model zoo (tests/zoo.py): dpl's ``from_exported_program`` beside TVM
0.27's ``tvm.relax.frontend.torch.from_exported_program`` on the same ExportedProgram.

    python bench/bench_zoo_import.py                 # llama, gpt2, bert, vit at the zoo's sizes
    python bench/bench_zoo_import.py llama qwen2     # chosen architectures

Each model is exported once, the stock way (``model(input_ids, attention_mask=...)`` with a
``Dim`` on the sequence; ``pixel_values`` with a ``Dim`` on the batch); both importers then run on
that program, best of ``REPEAT`` runs (the import includes each one's decomposition of the
program: dpl's functional ATen, TVM's core ATen). A failing importer prints its error.
"""

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from zoo import ARCHS  # noqa: E402

from dpl.frontend.torch_export import _export, _functional, from_exported_program  # noqa: E402
from dpl.frontend.torch_ops import ATEN_OPS  # noqa: E402

REPEAT = 3


def best(fn):
    times = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def tvm_import(program):
    from tvm.relax.frontend.torch import from_exported_program as tvm_from_exported_program

    return tvm_from_exported_program(program)


def main(names):
    warnings.simplefilter("ignore")
    print(f"{'model':26} {'nodes':>6} {'dpl ms':>8} {'(decomp)':>8} {'TVM ms':>8} {'TVM/dpl':>8}")
    for name in names:
        run(name, use_cache=None)
        if not ARCHS[name].vision:  # TVM cannot take the stock program of some: the one without a cache
            run(name, use_cache=False)


def run(name, use_cache):
    """One row: dpl and TVM importing the same program."""
    arch = ARCHS[name]
    model = arch.build("sdpa")
    inputs = arch.inputs(8, mask=arch.mask)
    if use_cache is not None:
        model.config.use_cache = use_cache
        name = f"{name} (use_cache={use_cache})"
    program = _export(torch, model, (), inputs, arch.dynamic_shapes(inputs))
    nodes = sum(1 for n in program.graph.nodes if n.op == "call_function")
    t_dpl = best(lambda: from_exported_program(program))
    t_decompose = best(lambda: _functional(program, ATEN_OPS))  # torch's share of dpl's import
    try:
        t_tvm = best(lambda: tvm_import(program))
        tvm = f"{t_tvm * 1e3:8.0f} {t_tvm / t_dpl:8.2f}"
    except Exception as err:  # TVM's frontend lacks ops some models use
        tvm = f"  failed: {type(err).__name__}: {str(err).strip().splitlines()[0][:80]}"
    print(f"{name:26} {nodes:6d} {t_dpl * 1e3:8.0f} {t_decompose * 1e3:8.0f} {tvm}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", metavar="model",
                        help=f"zoo architectures (default llama gpt2 bert vit; any of {', '.join(sorted(ARCHS))})")
    models = parser.parse_args().models or ["llama", "gpt2", "bert", "vit"]
    unknown = [m for m in models if m not in ARCHS]
    if unknown:
        parser.error(f"unknown architecture(s) {', '.join(unknown)}; choose from {', '.join(sorted(ARCHS))}")
    main(models)
