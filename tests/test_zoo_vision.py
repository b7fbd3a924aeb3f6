"""The vision zoo through both frontends: Swin (windowed attention, cyclic shift, a pad), SegFormer
(bilinear upsampling in its decode head, its logits the output), MobileNetV2 (depthwise convs,
relu6), EfficientNet (squeeze-excite, swish, "same" padding, a ceil-mode pool larger than its
input), RegNet (grouped convs) and MobileViT (an unfolding that merges the batch with the
positions in a patch): small transformers models from tests/zoo.py, random weights, seeded,
called as ``model(pixel_values)`` with a ``torch.export.Dim`` on the batch. Each import is fused,
built for ``cpu`` and ``numpy`` and compared with torch at two batch sizes (tests/zoo.py's
check_module: rtol 1e-4, atol 1e-5, a fall-back only for ops opaque by nature); its share of
fused ops stays at a floor.

torch.onnx.export(dynamo=True) of Swin with SDPA attention fails inside torch (its decomposition
step: "Cannot view a tensor with shape torch.Size([9*s99, 25, 2, 8]) and strides (400, 8, 200,
1) as a tensor with shape (9*s99, 25, 16)!"): the ONNX path takes Swin's eager attention, as its
users can (``attn_implementation="eager"``).

timm and torchvision CNNs are not here: the torchvision wheels reachable here are CUDA builds
that do not load against the CPU torch, and timm (0.9.16, 1.0.27) imports torchvision when it
is imported (``timm.layers.create_norm``).
"""

from __future__ import annotations

import pytest

import needs
from zoo import ARCHS, check_coverage, check_module, import_onnx, import_torch

transformers = needs.package("transformers", module_level=True)
torch = needs.package("torch", module_level=True)

VISION = ["mobilenet_v2", "regnet", "efficientnet", "mobilevit", "swin", "segformer"]
ONNX_ATTENTION = {"swin": "eager"}  # SDPA's export fails inside torch.onnx (the module docstring)
TORCH_LIBRARIES = ["rewrites", "llm"]
SHIPPED = ["rewrites", "llm", "cublas", "cnn"]


@pytest.fixture(scope="module", params=VISION)
def imported(request):
    """(arch, model, the dpl module) of a vision arch through torch.export."""
    arch = ARCHS[request.param]
    model, _inputs, mod = import_torch(arch)
    return arch, model, mod


@pytest.fixture(scope="module", params=VISION)
def onnx_imported(request):
    """(arch, model, the dpl module) of a vision arch through torch.onnx.export(dynamo=True)."""
    needs.package("onnxscript")
    arch = ARCHS[request.param]
    model, mod = import_onnx(arch, ONNX_ATTENTION.get(arch.name, "sdpa"))
    return arch, model, mod


def test_torch_import_matches_torch(imported):
    arch, model, mod = imported
    check_module(arch, model, mod, libraries=TORCH_LIBRARIES)


def test_onnx_import_matches_torch(onnx_imported):
    arch, model, mod = onnx_imported
    check_module(arch, model, mod, libraries=SHIPPED)


# The share of the ops that run (opaque ones and lone views left out) inside a composite or a
# fused group after rewrites and llm, as measured when this was written; a floor. What stays
# alone, as the trace says:
# - RegNet, EfficientNet: the squeeze-excite's adaptive average pools (`cnn` claims them);
# - MobileViT: the concats of the conv branch with the folded transformer output, the head's
#   mean, and the conv before the unfolding's transpose;
# - Swin: the patch embedding's permute before a layer_norm composite, the pad before the patch
#   merging's gathers, one product with two users; its `take`s are opaque by nature;
# - SegFormer: the permutes between tokens and images before layer_norm, attention and gelu.
COVERAGE_FLOOR = {"mobilenet_v2": 99, "regnet": 95, "efficientnet": 96, "mobilevit": 98, "swin": 98, "segformer": 94}


def test_coverage_stays_at_its_floor(imported):
    arch, _model, mod = imported
    check_coverage(arch.name, mod, TORCH_LIBRARIES, COVERAGE_FLOOR[arch.name])


# The ONNX imports with every shipped library. torch.onnx folds each batch norm into its conv,
# so there are fewer ops and a lone one weighs more: MobileNetV2's, EfficientNet's and
# MobileViT's lone ops are convs that automatic fusion leaves alone (a conv takes only
# elementwise ops after it, and these have a second user or their user joins another group),
# and MobileViT's concats and mean; SegFormer's permutes and one conv, Swin's softmaxes over
# the shifted windows.
ONNX_COVERAGE_FLOOR = {"mobilenet_v2": 92, "regnet": 99, "efficientnet": 91, "mobilevit": 97, "swin": 97,
                       "segformer": 93}


def test_onnx_coverage_stays_at_its_floor(onnx_imported):
    arch, _model, mod = onnx_imported
    check_coverage(f"{arch.name} (onnx)", mod, SHIPPED, ONNX_COVERAGE_FLOOR[arch.name])
