"""The engines bench/bench_zoo.py times dpl against besides torch: ONNX Runtime and OpenVINO.

Both read the same ONNX file, one ``torch.onnx.export(dynamo=True)`` per model and shape (static
shapes, as dpl's import is), and run on the row's thread count: ONNX Runtime with
``intra_op_num_threads`` (one inter-op thread, sequential), OpenVINO with
``INFERENCE_NUM_THREADS`` and the latency hint (one stream) and float32 inference precision
(on a CPU with AMX or AVX-512 bf16 it would otherwise compute in bfloat16, which is neither
what dpl computes nor within the check's tolerance).

The packages are the optional ``bench`` extra (``pip install -e .[bench]``); an engine whose
package is missing is reported as such by :func:`missing`, never an error.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import logging
import warnings

ENGINES = {"ort": "onnxruntime", "openvino": "openvino"}  # engine -> the package that provides it
TITLES = {"ort": "ONNX Runtime", "openvino": "OpenVINO"}


def missing(engine: str) -> str | None:
    """Why ``engine`` cannot run here (its package is not installed), or None."""
    if importlib.util.find_spec(ENGINES[engine]) is None:
        return f"{ENGINES[engine]} not installed (pip install -e .[bench])"
    return None


def version(engine: str) -> str:
    try:
        return importlib.metadata.version(ENGINES[engine])
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def export(torch, model, inputs: dict, path) -> None:
    """Write ``model`` called as ``model(**inputs)`` to the ONNX file ``path``, its outputs the
    model's tensors flattened as dpl's import flattens them (tests/zoo.py's ``torch_outputs``)."""
    from dpl.frontend.torch_export import tensor_outputs

    handle = model.register_forward_hook(lambda _m, _a, out: tensor_outputs(torch, out))
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            logging.getLogger("torch.onnx").setLevel(logging.ERROR)
            program = torch.onnx.export(model, (), kwargs=inputs, dynamo=True)
    finally:
        handle.remove()
    program.save(str(path))


def session(engine: str, path, threads: int):
    """A function of the inputs by name (``{name: array}``) giving ``engine``'s outputs of the
    ONNX file ``path`` (arrays, valid until its next call) on ``threads`` threads."""
    if engine == "ort":
        return _ort(path, threads)
    if engine == "openvino":
        return _openvino(path, threads)
    raise ValueError(f"unknown engine {engine!r}; the engines are {', '.join(ENGINES)}")


def _ort(path, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only
    sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda feeds: sess.run(None, {n: feeds[n] for n in names})


def _openvino(path, threads: int):
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32"}
    compiled = ov.Core().compile_model(str(path), "CPU", config)
    request = compiled.create_infer_request()
    names = [i.get_any_name() for i in compiled.inputs]
    count = len(compiled.outputs)

    def run(feeds):
        request.infer({n: feeds[n] for n in names})
        return [request.get_output_tensor(i).data for i in range(count)]

    return run
