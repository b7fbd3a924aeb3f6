"""Hash every kernel source dpl generates for the model zoo: a refactor that moves code must leave
each one byte-identical (issue 35). Prints one line per model (its kernels' count and digest)
and the digest of all of them; ``--save F`` writes the per-kernel sources for a diff.

    python scripts/kernel_sources.py [--models llama,gpt2,...] [--save sources.txt]

Per model: ``from_torch`` at a dynamic length, ``dpl.apply`` with every shipped library, a CPU
build (every C source the backend hands to its compiler: kernels, the packed products, max pool,
flash attention), and each fused function's CUDA source (``emit_cuda``) where it lowers.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

DEFAULT = "llama,gemma,phi3,gpt2,opt,bert,t5,vit,falcon,convnext,resnet"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT)
    parser.add_argument("--save", help="write every source, in order, to this file")
    args = parser.parse_args(argv)

    import dpl
    from dpl.backends.cpu import toolchain as c_toolchain
    from dpl.backends.cpu.backend import CpuBackend
    from dpl.backends.cuda.emitter import emit_cuda
    from dpl.kernel import LoweringError, lower_function
    from zoo import ARCHS

    seen: list[str] = []
    key = c_toolchain.KernelCache.key

    def recording(self, source):
        seen.append(source)
        return key(self, source)

    c_toolchain.KernelCache.key = recording
    everything, saved = hashlib.sha256(), []
    with tempfile.TemporaryDirectory() as cache:
        for name in args.models.split(","):
            arch = ARCHS[name]
            model = arch.build("sdpa")
            inputs = arch.inputs(8)
            mod = dpl.from_torch(model, (), inputs, dynamic_shapes=arch.dynamic_shapes(inputs))
            fused = dpl.apply(mod, ["rewrites", "llm", "cnn"])
            seen.clear()
            dpl.build(fused, [CpuBackend(cache_dir=cache), "numpy"], progress=False)
            sources = sorted(set(seen))
            for fn in fused.functions.values():
                if fn.name == "main":
                    continue
                try:
                    sources.append(emit_cuda(lower_function(fn)).code)
                except LoweringError:
                    pass
                except Exception as err:  # an emitter refusal is part of the behaviour: hash its text
                    sources.append(f"{type(err).__name__}: {err}")
            digest = hashlib.sha256("\0".join(sources).encode()).hexdigest()[:16]
            print(f"{name:12} {len(sources):4} sources  {digest}")
            everything.update(digest.encode())
            saved += [f"// ==== {name}\n{s}" for s in sources]
    print(f"{'all':12} {len(saved):4} sources  {everything.hexdigest()[:16]}")
    if args.save:
        Path(args.save).write_text("\n".join(saved))
    return 0


if __name__ == "__main__":
    sys.exit(main())
