"""What fusion did, on the model zoo: ``dpl report`` and ``dpl viz`` on stock transformers models
(tests/zoo.py) imported through torch (saved as text + ``.npz``, and as a ``torch.export.save``
``.pt2``) and through ONNX. The report's figures agree with ``Trace.coverage()`` and with an
independent count over the fused module's functions (tests/test_coverage.py); the HTML shows
every group with its kernel source, and the SVG names every group."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings

import pytest

import needs
from test_coverage import check_agrees, independent_count
from test_viz import check_page
from zoo import ARCHS

torch = needs.package("torch", module_level=True)
needs.package("transformers", module_level=True)

import dpl  # noqa: E402
from dpl.cli import main as dpl_main  # noqa: E402
from dpl.frontend.torch_export import tensor_outputs  # noqa: E402

LIBS = ["rewrites", "llm"]
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@contextlib.contextmanager
def tensor_outputs_hook(model):
    """The model's outputs without its DynamicCache, as dpl.from_torch exports it."""
    handle = model.register_forward_hook(lambda _m, _a, out: tensor_outputs(torch, out))
    try:
        yield
    finally:
        handle.remove()


def _export(arch, model, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tensor_outputs_hook(model):
            return torch.export.export(model, (), inputs, dynamic_shapes=arch.dynamic_shapes(inputs))


def _onnx(arch, model, inputs, path):
    needs.package("onnxscript")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), tensor_outputs_hook(model):
        warnings.simplefilter("ignore")
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        program = torch.onnx.export(model, (), kwargs=inputs, dynamic_shapes=arch.dynamic_shapes(inputs), dynamo=True)
    program.save(str(path))


@pytest.fixture(scope="module", params=[("llama", "ir"), ("gpt2", "ir"), ("bert", "pt2"), ("vit", "pt2"),
                                        ("resnet", "ir"), ("llama", "onnx")], ids=lambda p: f"{p[0]}-{p[1]}")
def saved(request, tmp_path_factory):
    """(arch name, a model file the command line reads) for one zoo model."""
    name, kind = request.param
    arch = ARCHS[name]
    model = arch.build("sdpa")
    inputs = arch.inputs(8 if not arch.vision else 2, mask=arch.mask)
    path = tmp_path_factory.mktemp(name) / f"model.{kind}"
    if kind == "onnx":
        _onnx(arch, model, inputs, path)
    elif kind == "pt2":
        torch.export.save(_export(arch, model, inputs), str(path))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dpl.save(dpl.from_torch(model, (), inputs, dynamic_shapes=arch.dynamic_shapes(inputs)), path)
    return name, path


def _trace(path):
    from dpl.frontend import load_model

    trace = dpl.Trace()
    dpl.apply(load_model(str(path)), LIBS, trace=trace)
    return trace


def test_dpl_report_agrees_with_trace_and_the_fused_module(saved, capsys):
    name, path = saved
    assert dpl_main(["report", str(path), "--json"] + [x for lib in LIBS for x in ("-p", lib)]) == 0
    report = {f["function"]: f for f in json.loads(capsys.readouterr().out)["functions"]}["main"]
    trace = _trace(path)
    cov = check_agrees(trace)  # Trace.coverage() against an independent count
    composites, auto, groups, alone = independent_count(trace.result)
    assert report["ops"] == cov.total
    assert report["automatic"]["ops"] == auto and report["alone"]["ops"] == alone
    assert report["composite"]["by_name"] == composites and report["composite"]["ops"] == sum(composites.values())
    assert sum(g["claim"] == "automatic" for g in report["groups"]) == groups
    if name != "resnet":
        assert cov.total > 20 and cov.by_composite(), "a transformer block claims composites"


@pytest.mark.parametrize("suffix", [".html", ".svg"])
def test_dpl_viz_draws_the_zoo(saved, suffix, tmp_path, capsys):
    if suffix == ".svg":
        needs.package("graphviz")
        needs.program("dot", "apt-get install -y graphviz")
    _name, path = saved
    out = tmp_path / f"out{suffix}"
    assert dpl_main(["viz", str(path), "-o", str(out)] + [x for lib in LIBS for x in ("-p", lib)]) == 0
    assert str(out) in capsys.readouterr().err  # "wrote ..." goes through the dpl logger
    trace = _trace(path)
    text = out.read_text()
    if suffix == ".html":
        check_page(text, trace)
    else:
        assert "<svg" in text
        for g in trace.coverage()["main"].groups:
            assert g.label in text
