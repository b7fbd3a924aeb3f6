"""The CPU's decode attention kernel (backends/cpu/decode_attention.py: one query row against n
cached keys, the keys split over tasks and merged) equals the interpreter: n from 1 to 4097,
head dims 16, 64 and 128, heads 4/4 and grouped 8/2, no mask, -inf columns, a boolean mask as
the torch frontend writes it (0 or the dtype's lowest), fully masked rows, one and two threads,
chunks of any size; and a build picks it for one query row and the flash kernel for more."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import needs

import dpl
from dpl.kernel.attention import read_attention
from test_flash_attention import attention_module, check, composite

MASKS = ("none", "-inf columns", "boolean", "fully masked row")


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    return CpuBackend(cache_dir=tmp_path_factory.mktemp("kernels"), attention="flash")


def decode_case(n, d, heads, kv_heads, mask, seed, batch=1, per_head_mask=False, dtype="f32"):
    """The module of one decode step (q [B, Hkv, G, 1, d] against k [B, Hkv, 1, d, n], as the
    torch frontend writes grouped-query attention) and its arguments."""
    group = heads // kv_heads
    q, k, v = (batch, kv_heads, group, 1, d), (batch, kv_heads, 1, d, n), (batch, kv_heads, 1, n, d)
    per_head_mask = per_head_mask or mask == "fully masked row"  # one head's row, beside its group's others
    mask_shape = None if mask == "none" else (batch, kv_heads, group, 1, n) if per_head_mask else (batch, 1, 1, 1, n)
    mod = attention_module(q, k, v, mask_shape, dtype=dtype, scale=f"multiply(s, {d ** -0.5})")
    rng = np.random.default_rng(seed)
    np_dtype = dpl.dtypes.to_numpy(mod["main"].params[0].ty.dtype)
    args = [(rng.standard_normal(p.ty.shape) * (4.0 if p.name == "q" else 1.0)).astype(np_dtype) for p in mod["main"].params]
    if mask != "none":
        hidden = rng.random(mask_shape) < 0.3
        hidden[..., -1] = False  # the newest key, the step's own, is seen
        if mask == "fully masked row":
            hidden[0, 0, 0] = True  # the first head's row sees nothing: NaN
        fill = np.finfo(np_dtype).min if mask == "boolean" else -np.inf
        args[3] = np.where(hidden, fill, 0.0).astype(np_dtype)
    return mod, args


def run_decode(backend, mod, args, threads=None, chunk=0):
    """The decode kernel of ``mod``'s attention on ``args``, ``threads`` and ``chunk`` keys a task
    (0: the kernel's own split)."""
    from dpl.backends.cpu import decode_attention as da

    fused, fn = composite(mod)
    named = dict(zip([p.name for p in mod["main"].params], args))
    call = next(b.value for b in fused["main"].bindings if b.value.op.name.endswith("_kernel"))
    ordered = [named[a.name] for a in call.args]  # the composite's parameter order
    shapes = tuple(a.shape for a in ordered)
    kernel = backend.compile(fn, module=fused, shapes=shapes)
    assert kernel.__qualname__.startswith("cpu-decode:"), kernel.__qualname__
    spec = read_attention(fn)
    if chunk:
        kernel = da.decode_runner(fn.name, spec, kernel.source, backend.cache.load(kernel.source),
                                  da.task_rows(spec, shapes), chunk=chunk)
    kernel = kernel.with_threads(threads)
    out = np.full(fn.ret.ty.shape, 7.0, args[0].dtype)  # every element must be written
    with np.errstate(all="ignore"):
        kernel(ordered, [out])
    return out


def reference(mod, args):
    with np.errstate(all="ignore"):
        return dpl.interpret(mod, *args)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (8, 2)])
@pytest.mark.parametrize("d", [16, 64, 128])
@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000, 4097])
def test_equals_the_interpreter(backend, n, d, heads, kv_heads, mask, threads):
    mod, args = decode_case(n, d, heads, kv_heads, mask, seed=n * d + heads)
    want = reference(mod, args)
    assert np.isnan(want).any() == (mask == "fully masked row")
    check(want, run_decode(backend, mod, args, threads), rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 3000), d=st.sampled_from([16, 40, 64, 128]), heads=st.sampled_from([(4, 4), (8, 2), (7, 1), (6, 3)]),
       mask=st.sampled_from(MASKS), per_head=st.booleans(), batch=st.integers(1, 2), threads=st.sampled_from([1, 2]),
       chunk=st.sampled_from([0, 1, 37, 64, 300]), seed=st.integers(0, 2**16))
def test_random_sizes_and_splits(backend, n, d, heads, mask, per_head, batch, threads, chunk, seed):
    """Any split of the keys (a chunk of 1 key, of 37: not whole tiles) merges to the
    interpreter's numbers, with masks per head or shared, several batch entries, groups of 1-7
    query heads (7 rows a task), a head dim off the vector width (40)."""
    mod, args = decode_case(n, d, *heads, mask, seed, batch=batch, per_head_mask=per_head)
    check(reference(mod, args), run_decode(backend, mod, args, threads, chunk), rtol=1e-5)


@pytest.mark.parametrize("chunk", [0, 50])
def test_nan_and_inf_scores_make_their_rows_nan_across_chunks(backend, chunk):
    """A NaN score among keys otherwise hidden (its chunk has no other score) or a +inf score
    makes the row NaN after the merge; a chunk all -inf adds nothing to a row the others see."""
    mod, args = decode_case(200, 16, 4, 4, "-inf columns", seed=3)
    mask = args[3]
    mask[...] = 0.0
    mask[..., 100:150] = -np.inf  # a whole chunk hidden (chunk 50)...
    for column, value in ((120, np.nan), (10, np.inf)):
        mask[..., column] = value  # ... but for a NaN; or a +inf elsewhere
        want = reference(mod, args)
        assert np.isnan(want).all()
        check(want, run_decode(backend, mod, args, chunk=chunk))
        mask[..., column] = -np.inf if column == 120 else 0.0
    want = reference(mod, args)
    assert not np.isnan(want).any()
    check(want, run_decode(backend, mod, args, chunk=chunk))


@pytest.mark.parametrize("dtype, rtol", [("f64", 1e-12), ("f16", 5e-3), ("bf16", 3e-2)])
def test_other_float_dtypes(backend, dtype, rtol):
    mod, args = decode_case(700, 64, 8, 2, "-inf columns", seed=5, dtype=dtype)
    for chunk in (0, 100):
        check(reference(mod, args), run_decode(backend, mod, args, chunk=chunk), rtol)


def test_row_blocks_gather_the_query_heads_of_one_stream():
    """Batch entries that read the same k/v matrices share a block (GQA's query heads), a block
    holds at most ``rows`` rows and never two groups."""
    from dpl.backends.cpu import decode_attention as da
    from dpl.backends.cpu.flash_attention import batch_layout

    mod, _ = decode_case(10, 16, 8, 2, "none", seed=0, batch=2)
    spec = read_attention(composite(mod)[1])
    q, k, v = (2, 2, 4, 1, 16), (2, 2, 1, 16, 10), (2, 2, 1, 10, 16)
    offsets, dims = batch_layout(spec, q, k, v, None, (2, 2, 4, 1, 16))
    order, blocks = da.row_blocks(offsets, dims, 3)
    assert sorted(order.tolist()) == list(range(16))
    assert [offsets[1][b] for b in order.tolist()] == sorted(offsets[1].tolist())  # each group's entries together
    assert blocks.reshape(-1, 2).tolist() == [[0, 3], [3, 1], [4, 3], [7, 1], [8, 3], [11, 1], [12, 3], [15, 1]]
    assert da.task_rows(spec, (q, k, v)) == 4


def symbolic_decoder_attention(mask: bool):
    """Grouped-query attention of ``t`` query rows against ``n`` keys, both symbolic."""
    params = "q: f32[1, 2, 4, t, 64], k: f32[1, 2, 1, 64, n], v: f32[1, 2, 1, n, 64]" + (", mask: f32[t, n]" if mask else "")
    scores = "w = add(z, mask)\n  p = nn.softmax(w)" if mask else "p = nn.softmax(z)"
    return dpl.parse(f"""
func main({params}) -> f32[1, 2, 4, t, 64] {{
  s = matmul(q, k)
  z = multiply(s, 0.125)
  {scores}
  o = matmul(p, v)
  return o
}}""")


@pytest.mark.parametrize("attention", ["auto", "flash"])
def test_one_query_row_gets_the_decode_kernel_and_more_get_flash(tmp_path, attention):
    """One build, symbolic lengths: a plan per signature, the decode kernel for one query row
    (a task holding the group's 4 query heads), the flash kernel for 5; both the interpreter's."""
    from dpl.backends.cpu.backend import CpuBackend

    needs.c_compiler()
    mod = symbolic_decoder_attention(mask=True)
    exe = dpl.build(dpl.apply(mod, ["llm"]), [CpuBackend(cache_dir=tmp_path, attention=attention), "numpy"],
                    config=dpl.FusionConfig(fallback_on_error=False), threads=1)
    rng = np.random.default_rng(0)
    for rows in (1, 5):
        args = [rng.standard_normal(s).astype(np.float32) for s in [(1, 2, 4, rows, 64), (1, 2, 1, 64, 300),
                                                                    (1, 2, 1, 300, 64), (rows, 300)]]
        check(reference(mod, args), exe(*args))
    plans = {section.split(")", 1)[0]: section for section in exe.summary().split("plan for (")[1:]}
    decode = plans["f32[1, 2, 4, 1, 64], f32[1, 2, 1, 64, 300], f32[1, 2, 1, 300, 64], f32[1, 300]"]
    flash = plans["f32[1, 2, 4, 5, 64], f32[1, 2, 1, 64, 300], f32[1, 2, 1, 300, 64], f32[5, 300]"]
    assert "decode attention (1 query row, 4 a task" in decode and "flash attention" not in decode, decode
    assert "flash attention (" in flash and "decode" not in flash, flash
    if attention == "auto":  # flash raced against the segments; decode alone (4-6x them at every size measured)
        assert "or segments" not in decode and "attention: flash or segments" in flash


@pytest.mark.parametrize("rows", [1, 3])
def test_no_keys_give_the_interpreters_zeros_even_where_flash_is_asked_for(backend, rows):
    """Softmax over no keys is an empty sum: the weighted values are zeros. The decode and flash
    kernels would write NaN (no maximum), so the build takes the two products for them."""
    mod = attention_module((1, 2, 4, rows, 16), (1, 2, 1, 16, 0), (1, 2, 1, 0, 16))
    args = [np.ones(p.ty.shape, np.float32) for p in mod["main"].params]
    fused, fn = composite(mod)
    kernel = backend.compile(fn, module=fused, shapes=tuple(a.shape for a in args))
    assert not kernel.__qualname__.startswith(("cpu-decode:", "cpu-flash:")), kernel.__qualname__
    out = np.full(fn.ret.ty.shape, 7.0, np.float32)
    kernel(args, [out])
    np.testing.assert_array_equal(out, reference(mod, args))


def test_attention_kernels_join_the_prepared_call_with_the_general_paths_bits(tmp_path):
    """The decode kernel (not raced) is a record of the step's prepared call from its first call;
    the flash kernel, raced against the segments, joins it once the race has chosen (the call is
    prepared again); both give the general path's bits."""
    from dpl.backends.cpu.backend import CpuBackend
    from dpl.runtime.prepared import MixedCall, PreparedCall

    needs.c_compiler()
    mod = symbolic_decoder_attention(mask=True)
    exe = dpl.build(dpl.apply(mod, ["llm"]), [CpuBackend(cache_dir=tmp_path), "numpy"],
                    config=dpl.FusionConfig(fallback_on_error=False), threads=1)
    rng = np.random.default_rng(2)
    for rows in (1, 5):
        args = [rng.standard_normal(s).astype(np.float32) for s in [(1, 2, 4, rows, 64), (1, 2, 1, 64, 200),
                                                                    (1, 2, 1, 200, 64), (rows, 200)]]
        for _ in range(12):  # the race times each kernel three times, after a warm-up
            got = exe(*args)
        plan = exe.plan(*args)
        (prepared,) = plan._prepared.values()
        in_python = [p for p in getattr(prepared, "parts", ()) if not isinstance(p, PreparedCall)]
        assert isinstance(prepared, (PreparedCall, MixedCall)) and not in_python, (rows, in_python)
        general = plan.run(exe._flat_inputs(args), None, timer=lambda step, run: run())
        assert got.tobytes() == general.tobytes()
        check(reference(mod, args), got)
