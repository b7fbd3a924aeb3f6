"""torchvision's CNNs through ``torch.compile(model, backend="dpl")``, run as a child process by
tests/test_torch_compile_torchvision.py (which says why a child):

    python tests/torchvision_zoo.py OUT.json NAME[:SIZE] ...

with torchvision on ``PYTHONPATH``. Each model is built from torchvision's own constructor with
random weights made realistic: every BatchNorm's running statistics measured on random images
(train mode, one pass, cumulative average), so activations stay O(1) in eval as in a trained
model (with the constructors' identity statistics Inception's logits reach 1e12 and compare
nothing), and a weight matrix its constructor leaves all zeros (ViT-style heads) drawn at
random. Then batch 2 and 3 through one dynamic graph, each against eager torch (rtol 1e-4, atol 1e-5;
where a deep net's own float32 rounding exceeds that, against its float64 result: dpl no farther
from it than twice eager). Writes per model the largest difference, whether it held, dpl's share
of the ops and what ran in torch."""

from __future__ import annotations

import copy
import json
import sys
import time
import traceback

import torch

# torchvision's PyPI wheels are CUDA builds: their C ops (nms, roi_align, ...) cannot load beside
# a CPU torch, and at import torchvision registers fake kernels for two of them, which fails when
# the operators do not exist. The models use none of its C ops: declaring these two schemas lets
# the import go through; calling either would fail loudly ("no kernel"), never run silently.
_SCHEMAS = torch.library.Library("torchvision", "DEF")
for _op in ("nms", "qnms"):
    _SCHEMAS.define(f"{_op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")

import torchvision  # noqa: E402

from dpl.frontend import dynamo  # noqa: E402
from dpl.frontend.dynamo_report import Report  # noqa: E402

TOL = dict(rtol=1e-4, atol=1e-5)
OPTIONS = {"googlenet": dict(aux_logits=False, init_weights=True), "inception_v3": dict(aux_logits=False, init_weights=True)}


def build(name: str, size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = getattr(torchvision.models, name)(weights=None, **OPTIONS.get(name, {}))
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2 and not param.any():
                param.normal_(0.0, 0.02)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        for norm in norms:
            norm.reset_running_stats()
            norm.momentum = None
        model.train()
        with torch.no_grad():
            model(torch.randn(16, 3, size, size, generator=torch.Generator().manual_seed(1)))
    return model.eval()


def run(name: str, size: int) -> dict:
    start = time.perf_counter()
    model = build(name, size)
    torch._dynamo.reset()
    seen = len(dynamo.reports().graphs)
    compiled = torch.compile(model, backend="dpl")
    worst, close, spread, against_f64 = 0.0, True, float("inf"), []
    with torch.no_grad():
        for batch in (2, 3):  # not 1: dynamo specializes a size of 1
            x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))
            torch._dynamo.mark_dynamic(x, 0)
            got, want = compiled(x), model(x)
            worst = max(worst, float((got - want).abs().max()))
            spread = min(spread, float(want.std()))
            if not torch.allclose(got, want, **TOL):
                # a deep net's float32 rounding can exceed the tolerance on its own: then dpl must be
                # no farther from the float64 result than twice eager's own float32 error
                exact = copy.deepcopy(model).double()(x.double())
                errors = [float((y.double() - exact).abs().max()) for y in (got, want)]
                against_f64.append(errors)
                close = close and errors[0] <= 2 * errors[1]
    report = Report(dynamo.reports().graphs[seen:])
    return dict(worst=worst, close=close, spread=spread, against_f64=against_f64, share=report.share(), in_torch=report.in_torch(),
                graphs=len(report.graphs),
                notes=[g.note for g in report.graphs if g.note], text=report.text(), seconds=time.perf_counter() - start)


def main(out: str, *specs: str) -> int:
    results = {}
    for spec in specs:
        name, _, size = spec.partition(":")
        try:
            results[name] = run(name, int(size or 64))
        except Exception:  # the parent test names the model and shows this
            results[name] = dict(error=traceback.format_exc()[-4000:])
        print(name, {k: v for k, v in results[name].items() if k != "text"}, flush=True)
    with open(out, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
