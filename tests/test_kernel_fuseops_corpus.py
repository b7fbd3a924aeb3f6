"""Every group FuseOps forms on the automatic-fusion corpus (the 300 random DAGs and the
examples) lowers to ONE kernel whose evaluation equals the group's interpretation."""

from pathlib import Path

import numpy as np
import pytest

import dpl
from dpl.ir import Module
from dpl.kernel import evaluate, lower_function
from dpl.transform import fuse_ops

from test_fuse_ops import RandomDag

EXAMPLES = Path(__file__).parent.parent / "examples"


def check_groups(mod, rng):
    fused = fuse_ops(mod)
    count = 0
    for fn in fused.functions.values():
        if "Primitive" not in fn.attrs:
            continue
        kernel = lower_function(fn)  # one kernel, or a LoweringError naming the binding
        dims = {}
        args = []
        for p in fn.params:
            shape = tuple(dims.setdefault(d, 5) if isinstance(d, str) else d for d in p.ty.shape)
            args.append(rng.standard_normal(shape).astype(dpl.dtypes.to_numpy(p.ty.dtype)))
        want = dpl.interpret(fn, *args)
        got = evaluate(kernel, *args)
        wants = want if isinstance(want, tuple) else (want,)
        gots = got if isinstance(got, tuple) else (got,)
        assert len(wants) == len(gots)
        for w, g in zip(wants, gots):
            tol = 5e-3 if w.dtype == np.float16 else 1e-5
            # sums in float32 in another order than the interpreter's (the numerical contract fixes
            # the accumulator, not the order): the absolute tolerance scales with the output
            scale = max(float(np.abs(w.astype(np.float64)).max()) if w.size else 1.0, 1.0)
            np.testing.assert_allclose(np.asarray(g, np.float64), w.astype(np.float64), rtol=tol, atol=tol * scale)
        count += 1
    return count


def test_random_dag_groups_lower_to_one_kernel_each():
    rng = np.random.default_rng(0)
    total = sum(check_groups(Module([RandomDag(seed).build()]), rng) for seed in range(300))
    assert total >= 200  # 241 fused functions in the 300 DAGs


@pytest.mark.parametrize("example", sorted(EXAMPLES.glob("*.ir")), ids=lambda p: p.stem)
def test_example_groups_lower_to_one_kernel_each(example):
    assert check_groups(dpl.load(example), np.random.default_rng(1)) >= 1
