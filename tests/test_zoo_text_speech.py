"""The zoo's text and speech architectures beyond decoders and BERT, through both frontends: an
encoder-decoder (BART: input_ids, attention_mask and decoder_input_ids, encoder and decoder
lengths each a Dim), a speech encoder with 1-D convolutions, group norm and a weight-normed
positional convolution (wav2vec2: a Dim on the samples, so the frames are ``samples // 10 - 1``),
disentangled attention (DeBERTa-v2: relative position buckets with sign, log, ceil, abs and
gathers), a mixture of experts (Mixtral) and a state-space model (Mamba2). Each is imported
with its dynamic dims, fused with ``rewrites`` and ``llm``, built for ``cpu`` and ``numpy`` and
compared with torch at two sizes (tests/zoo.py: ``Arch.kind``, ``Arch.lengths``).

What torch itself cannot export, as its own exporters report it (torch 2.13, transformers 5.23):

- Mixtral through ONNX with its default experts (``grouped_mm``, which traces to the custom op
  ``transformers::grouped_mm_fallback`` in float32): torch.onnx raises ``DispatchError: No ONNX
  function found for <OpOverload(op='transformers.grouped_mm_fallback', overload='default')>``.
  The ONNX path takes ``experts_implementation="batched_mm"`` (``mixtral_batched``), which the
  torch path imports too. Through torch.export the default imports: dpl translates the custom op
  to its ``grouped_matmul`` (dpl/frontend/torch_moe.py), whose gate and up product ``llm`` claims
  with its gated unit (``llm.grouped_matmul_glu``).
- Mamba2 over a range of lengths: its scan pads the sequence to a multiple of the chunk and
  branches on ``if pad_size > 0``, so torch.export guards ``(4 - seq % 4) % 4 <= 0`` (chunk 4)
  and, with a chunk longer than any sequence (128), stops with "Specializations unexpectedly
  required (seq)! ... resulted in a specialized value of 8", with or without deferred runtime
  asserts. Over lengths that are multiples of the chunk (a derived Dim, ``4 * chunks``;
  ``Arch.length_multiple``) both exporters trace it, and it is compared at 8 and 12 tokens.
"""

from __future__ import annotations

import pytest

import needs
from zoo import ARCHS, check_coverage, check_module, import_onnx, import_torch

transformers = needs.package("transformers", module_level=True)
torch = needs.package("torch", module_level=True)

import dpl  # noqa: E402

# DeBERTa's log buckets take log(0) where a later where() discards it, as torch does
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning",
                                        "ignore:invalid value encountered in cast:RuntimeWarning")

TORCH = ["wav2vec2", "deberta_v2", "bart", "mixtral", "mamba2"]
ONNX = ["wav2vec2", "deberta_v2", "bart", "mixtral_batched", "mamba2"]


@pytest.fixture(scope="module", params=TORCH)
def imported(request):
    """(arch, model, the dpl module) through torch.export with the arch's dynamic dims."""
    arch = ARCHS[request.param]
    model, _inputs, mod = import_torch(arch, "sdpa" if arch.attention else "eager")
    return arch, model, mod


def test_torch_import_matches_torch(imported):
    arch, model, mod = imported
    check_module(arch, model, mod)


@pytest.fixture(scope="module", params=ONNX)
def onnx_imported(request):
    needs.package("onnxscript")
    arch = ARCHS[request.param]
    model, mod = import_onnx(arch)
    return arch, model, mod


def test_onnx_import_matches_torch(onnx_imported):
    """The real tokens of padded rows, as tests/test_zoo.py compares them."""
    arch, model, mod = onnx_imported
    check_module(arch, model, mod, real_tokens_only=True)


# The share of the ops that run (opaque ones and lone views left out) inside a composite or a
# fused group after dpl.apply(mod, ["rewrites", "llm"]), torch path, as measured when this was
# written: a floor. What stays alone: wav2vec2's 1-D convs and their layout permutes (no
# composite; group norm is opaque), the all-true mask's arange; DeBERTa's relative-position
# products (their permutes), claimed by cublas; Mixtral's routing (sort, histc, cumsum,
# index_put: opaque) and its experts' down projections (grouped_matmul: opaque), the rows'
# arange; Mamba2's chunk slices and the scan's permutes.
COVERAGE_FLOOR = {"wav2vec2": 94, "deberta_v2": 95, "bart": 99, "mixtral": 94, "mamba2": 97}


def test_coverage_stays_at_its_floor(imported):
    arch, _model, mod = imported
    check_coverage(arch.name, mod, ["rewrites", "llm"], COVERAGE_FLOOR[arch.name])


@pytest.mark.parametrize("imported", ["mixtral"], indirect=True)
def test_the_experts_gated_unit_is_one_composite(imported):
    """Mixtral's experts: each layer's gate and up grouped product and silu(gate) * up are one
    ``llm.grouped_matmul_glu`` composite; the down projection stays a lone grouped_matmul."""
    arch, _model, mod = imported
    fused = dpl.apply(mod, ["rewrites", "llm"])
    composites = [f.attrs.get("Composite") for f in fused.functions.values()]
    assert composites.count("kernel.grouped_matmul_glu") == arch.kwargs.get("num_hidden_layers", 2)
    lone = [b.value.op for b in fused["main"].bindings if getattr(b.value, "op", None) == "grouped_matmul"]
    assert len(lone) == composites.count("kernel.grouped_matmul_glu")
