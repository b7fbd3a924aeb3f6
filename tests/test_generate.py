"""Hugging Face ``generate`` on a decoder whose forward runs through dpl's torch.compile backend:
greedy decoding gives eager torch's tokens, with the default dynamic cache and with
``cache_implementation="static"`` (whose in-place cache writes come back to the cache tensors
through AOTAutograd's input mutations), and the decode steps run in dpl, attention included.

The decoders are tests/zoo.py's small configs with their language-model heads, initialised with
a wide range (0.3) so that greedy decoding does not settle on one token at once: a wrong cache
changes the tokens. 8 new tokens here (bench/bench_generate.py does 32), to keep the file near
a minute: most of it is the builds of each decoder's prefill and decode graphs.
"""

from __future__ import annotations

import logging

import pytest

import needs

torch = needs.package("torch", module_level=True)
transformers = needs.package("transformers", module_level=True)

import dpl  # noqa: E402
from zoo import _DECODER, VOCAB  # noqa: E402

PROMPT, NEW_TOKENS = 12, 8

DECODERS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(_DECODER)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(_DECODER)),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128)),
}


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def decoder(name: str):
    model_class, config_class, kwargs = DECODERS[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**kwargs, initializer_range=0.3, pad_token_id=0)
    config._attn_implementation = "sdpa"
    return getattr(transformers, model_class)(config).eval()


def prompt():
    return torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))


def settings(cache: str, **more) -> dict:
    out = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, **more)
    if cache == "static":
        out["cache_implementation"] = "static"
    return out


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("name", list(DECODERS))
def test_greedy_generate_gives_eager_tokens_and_decodes_in_dpl(name, cache):
    model, ids = decoder(name), prompt()
    with torch.no_grad():
        want = model.generate(ids, **settings(cache))
    assert len(set(want[0, PROMPT:].tolist())) > 1, "a decoder stuck on one token tests no cache"
    model.forward = dpl.compile(model.forward)  # Hugging Face's spelling: the forward compiled, generate as it is
    report = model.forward.dpl_report
    with torch.no_grad():
        got = model.generate(ids, **settings(cache))
    assert torch.equal(got, want), (got[0, PROMPT:].tolist(), want[0, PROMPT:].tolist())

    # prefill, decode (the dynamic cache's first decode is specialised, the next ones symbolic): all in dpl
    assert 2 <= len(report.graphs) <= 3, report.text()
    assert report.ops("torch") == 0, report.text()
    decode = [g for g in report.graphs if g.inputs.startswith("int64[1, 1]")]
    calls = sum(p.calls for g in decode for p in g.parts if p.runs == "dpl")
    assert calls == NEW_TOKENS - 1, report.text()  # one call of the decode graph's partition a new token after the first
    assert all("kernel.attention" in p.composites for g in decode for p in g.parts), report.text()
    if cache == "static":  # each layer's key and value caches written where they are, not copied and copied back
        layers = model.config.num_hidden_layers if hasattr(model.config, "num_hidden_layers") else model.config.n_layer
        assert [p.in_place for g in decode for p in g.parts] == [2 * layers], report.text()


class GroupedAttention(torch.nn.Module):
    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True) * 2.0


@pytest.mark.parametrize("mask", [None, "bool[b,1,q,k]", "float[h,q,k]", "float[q,k]"])
def test_attention_of_grouped_query_heads_translates(mask):
    """SDPA with enable_gqa=True (Llama's and Qwen2's prefill: 2 key/value heads for 4 query
    heads), with each shape of mask torch broadcasts over the heads."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 2, 7, 8, generator=g), torch.randn(2, 2, 7, 8, generator=g)
    masks = {None: None, "bool[b,1,q,k]": torch.rand(2, 1, 5, 7, generator=g) > 0.3,
             "float[h,q,k]": torch.randn(4, 5, 7, generator=g), "float[q,k]": torch.randn(5, 7, generator=g)}
    compiled = dpl.compile(GroupedAttention(), target="numpy")
    with torch.no_grad():
        got, want = compiled(q, k, v, masks[mask]), GroupedAttention()(q, k, v, masks[mask])
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert compiled.dpl_report.ops("torch") == 0, compiled.dpl_report.text()


def repeat_heads(x, n):
    """Hugging Face's repeat_kv, as transformers writes it."""
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n, s, d).reshape(b, h * n, s, d)


class RepeatedHeads(torch.nn.Module):
    """Attention over key/value heads repeated for the query heads (the static cache's path)."""

    def __init__(self, repeat=repeat_heads):
        super().__init__()
        self.repeat = repeat

    def forward(self, q, k, v, mask):
        return torch.nn.functional.scaled_dot_product_attention(q, self.repeat(k, 2), self.repeat(v, 2), attn_mask=mask) * 2.0


def _batch_repeated(x, n):  # repeats the batch axis, not the heads: plain attention
    return x.expand(n, *x.shape[1:]).reshape(n, *x.shape[1:]).repeat(1, 2, 1, 1)


@pytest.mark.parametrize("mask", [None, "bool[b,1,q,k]", "float[b,h,q,k]", "float[q,k]"])
def test_attention_over_repeated_key_value_heads_reads_them_unrepeated(mask):
    """repeat_kv then SDPA is grouped-query attention over the unrepeated heads: the module
    keeps no broadcast of them (a copy of each layer's cache a token), and equals torch with each
    shape of mask; a lookalike that repeats something else stays plain attention."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8, generator=g), torch.randn(2, 2, 7, 8, generator=g), torch.randn(2, 2, 7, 8, generator=g)
    masks = {None: None, "bool[b,1,q,k]": torch.rand(2, 1, 5, 7, generator=g) > 0.3,
             "float[b,h,q,k]": torch.randn(2, 4, 5, 7, generator=g), "float[q,k]": torch.randn(5, 7, generator=g)}
    for model, grouped in ((RepeatedHeads(), True), (RepeatedHeads(_batch_repeated), False)):
        args = (q, k, v, masks[mask]) if grouped else (q, k[:1], v[:1], masks[mask])
        mod = dpl.from_torch(model, args)
        ops = {b.value.op for b in mod["main"].bindings if hasattr(b.value, "op")}
        assert ("broadcast_to" not in ops) is grouped, mod
        for target in ("numpy", "cpu"):
            compiled = dpl.compile(model, target=target)
            with torch.no_grad():
                got, want = compiled(*args), model(*args)
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-5), (target, (got - want).abs().max())
            torch._dynamo.reset()


def test_key_and_value_lengths_traced_apart_are_guarded_equal():
    """Dynamo's automatic dynamic shapes give the key's and the value's lengths a symbol each
    (as a decoder's cache at its second decode step); the backend guards them equal, so the
    attention is dpl's."""

    def attend(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v) + 1.0

    compiled = dpl.compile(attend, target="numpy")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for keys in (5, 6, 9):  # the second call compiles the graph again, its lengths symbolic
            q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (1, keys, keys))
            assert torch.allclose(compiled(q, k, v), attend(q, k, v), rtol=1e-5, atol=1e-5)
    first, symbolic = compiled.dpl_report.graphs
    assert "float32[1, 2, s" in symbolic.inputs and symbolic.ops("torch") == 0, symbolic.text()


def test_hugging_faces_compile_config_spelling_takes_the_dpl_backend(caplog):
    """``generate(compile_config=CompileConfig(backend="dpl"))``: Hugging Face compiles the
    decode steps with the static cache itself, passing inductor's ``mode`` to the backend."""
    from dpl.frontend import dynamo

    model, ids = decoder("qwen2"), prompt()
    with torch.no_grad():
        want = model.generate(ids, **settings("static"))
    config = transformers.CompileConfig(backend="dpl")
    config._compile_all_devices = True  # Hugging Face compiles on CUDA only unless told
    before = len(dynamo.reports().graphs)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="dpl"):
        got = model.generate(ids, **settings("static", compile_config=config))
    assert torch.equal(got, want)
    graphs = dynamo.reports().graphs[before:]
    assert len(graphs) == 1 and graphs[0].ops("torch") == 0, graphs  # the decode graph; prefill runs eagerly
    assert not caplog.records
