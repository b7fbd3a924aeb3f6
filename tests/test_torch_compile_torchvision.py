"""Issue 31's acceptance names torchvision CNNs among the models users run: each of these, built by
torchvision's own constructor with random weights, runs through ``torch.compile(model,
backend="dpl")`` at two batch sizes of one dynamic graph, equal to eager torch, with what ran in
torch listed and why, and >= 95% of its ops in dpl.

torchvision is not a test dependency. Its PyPI wheels are CUDA builds whose C ops cannot load
beside the pinned CPU torch, and once installed, transformers imports it (and fails) wherever it
finds it. So the fixture installs the release built against torch 2.13.0 into pytest's cache
folder (``pip install --target``, no dependencies but Pillow), and the models run in a child
process that alone has it on its path (tests/torchvision_zoo.py, which says how its import is
made to work)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import needs

torch = needs.package("torch", module_level=True)

TORCHVISION, PILLOW = "0.28.0", "13.0.0"  # torchvision 0.28 is the release built against torch 2.13
FLOOR = 0.95
# name: image size (the smallest each architecture takes comfortably; Inception needs 75, MaxViT
# and Swin's windows want 224 and multiples of 32)
MODELS = {
    "resnet18": 64, "resnext50_32x4d": 64, "wide_resnet50_2": 64, "densenet121": 64, "googlenet": 64,
    "inception_v3": 80, "mobilenet_v3_small": 64, "mobilenet_v3_large": 64, "mnasnet0_5": 64,
    "shufflenet_v2_x0_5": 64, "squeezenet1_1": 64, "efficientnet_b0": 64, "efficientnet_v2_s": 64,
    "regnet_y_400mf": 64, "convnext_tiny": 64, "alexnet": 64, "maxvit_t": 224, "swin_t": 64,
}


@pytest.fixture(scope="module")
def torchvision_path(request) -> Path:
    """A folder holding torchvision (and Pillow), installed once per pytest cache."""
    folder = Path(request.config.cache.mkdir(f"torchvision-{TORCHVISION}"))
    if not (folder / "torchvision" / "__init__.py").exists():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder),
                               f"torchvision=={TORCHVISION}", f"pillow=={PILLOW}"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            needs.missing(f"could not install torchvision {TORCHVISION}: {done.stderr[-1000:]}")
    return folder


@pytest.fixture(scope="module")
def results(torchvision_path, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("torchvision") / "results.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(torchvision_path), os.environ.get("PYTHONPATH", "")])}
    child = Path(__file__).with_name("torchvision_zoo.py")
    done = subprocess.run([sys.executable, str(child), str(out), *(f"{n}:{s}" for n, s in MODELS.items())],
                          capture_output=True, text=True, timeout=1800, env=env)
    assert done.returncode == 0 and out.exists(), (done.stdout + done.stderr)[-4000:]
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_torchvision_cnns_equal_eager_with_most_ops_in_dpl(results, name):
    got = results[name]
    assert "error" not in got, got.get("error")
    print(f"{name}: {got['share']:.1%} of ops in dpl\n{got['text']}")
    assert got["close"], f"{name}: off by {got['worst']} (against float64: {got['against_f64']})"
    assert got["spread"] > 1e-3, f"{name}: eager's outputs barely vary ({got['spread']}): a comparison of nothing"
    assert got["graphs"] == 1 and not got["notes"], got["text"]  # one dynamic graph, none fell to torch whole
    assert all(got["in_torch"].values()), got["text"]  # every op in torch says why
    assert got["share"] >= FLOOR, got["text"]
