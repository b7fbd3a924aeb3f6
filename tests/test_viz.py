"""Pictures (``dpl.draw``, ``dpl viz``) and the demo (``dpl demo``): every example and a few
torch.nn models draw as self-contained HTML and as Graphviz SVG; every group the coverage
finds is a box with its ops, its pattern and its kernel source; missing Graphviz is a clear
error, not a traceback."""

import json
import re
from pathlib import Path

import pytest

import needs

import dpl
from dpl.cli import main as dpl_main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CASES = [("llama_mlp.ir", ["rewrites", "llm"]), ("conv_block.ir", ["llm"]),
         ("residual_rmsnorm.ir", ["rewrites", "llm"]), ("attention.ir", ["rewrites", "llm"])]


def page_data(text: str) -> dict:
    return json.loads(re.search(r'<script type="application/json" id="dpl-data">(.*?)</script>', text, re.S).group(1))


def check_page(text: str, trace) -> None:
    # one file, nothing fetched: no external scripts, styles, images or fonts
    assert not re.search(r'<(script|link|img)[^>]+(src|href)=', text)
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in text
    data = page_data(text)["nodes"]
    cov = trace.coverage(target="cpu")["main"]
    for g in cov.groups:
        node = data[f"a:{g.bindings[0]}"]
        assert node["name"] == g.function
        assert all(op in node["detail"]["ir"] for op in g.ops)
        assert node["detail"]["kernel source"]
        if g.claim == "composite":
            assert node["title"] == g.composite and node["detail"]["pattern"] == g.origin
    for a in cov.alone:
        assert data[f"a:{a.binding}"]["claim"] == "alone"
        assert data[f"a:{a.binding}"]["detail"]["why alone"] == a.detail
    # before apply: every op of the input is a node
    before = [k for k in data if k.startswith("b:") and not k.startswith("b:p:") and k != "b:return"
              and not k.endswith(":repeats")]  # a collapsed run of repeated layers is a node of its own
    assert len(before) == sum(isinstance(b.value, dpl.Call) for b in trace.source["main"].bindings)  # items are edges


@pytest.mark.parametrize("name, patterns", CASES)
def test_dpl_viz_writes_html_for_each_example(name, patterns, tmp_path, capsys):
    out = tmp_path / "out.html"
    args = ["viz", str(EXAMPLES / name), "-o", str(out)] + [x for p in patterns for x in ("-p", p)]
    assert dpl_main(args) == 0
    assert f"dpl: wrote {out}" in capsys.readouterr().err  # on stderr, as every command that writes a file says it
    trace = dpl.Trace()
    dpl.apply(dpl.load(EXAMPLES / name), patterns, trace=trace)
    check_page(out.read_text(), trace)


@pytest.mark.parametrize("name, patterns", CASES)
def test_dpl_viz_writes_svg_for_each_example(name, patterns, tmp_path):
    needs.package("graphviz")
    needs.program("dot", "apt-get install -y graphviz")
    out = tmp_path / "out.svg"
    args = ["viz", str(EXAMPLES / name), "-o", str(out)] + [x for p in patterns for x in ("-p", p)]
    assert dpl_main(args) == 0
    text = out.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    trace = dpl.Trace()
    dpl.apply(dpl.load(EXAMPLES / name), patterns, trace=trace)
    for g in trace.coverage()["main"].groups:
        assert g.label in text  # every group drawn, named by what claimed it
    assert "before apply" in text and "after apply" in text


def test_svg_without_dot_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    needs.package("graphviz")
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot here
    # (the numpy target: the cpu backend would look for cc on this PATH too)
    assert dpl_main(["viz", str(EXAMPLES / "llama_mlp.ir"), "--target", "numpy", "-o", str(tmp_path / "x.svg")]) == 1
    err = capsys.readouterr().err
    assert "'dot'" in err and "apt-get install graphviz" in err and ".html" in err


def test_viz_refuses_an_unknown_file_type(tmp_path, capsys):
    assert dpl_main(["viz", str(EXAMPLES / "llama_mlp.ir"), "-o", str(tmp_path / "x.png")]) == 1
    assert "must end in .html or .svg" in capsys.readouterr().err


def test_groups_that_fall_back_at_run_time_are_drawn_as_such():
    """conv_block's groups read a 576-element weight: the seed's rule 3 runs them op by op."""
    drawing = dpl.draw(dpl.load(EXAMPLES / "conv_block.ir"), ["llm"], config=dpl.FusionConfig.seed())
    _, after = drawing.views[0]
    claims = {n.name: n.claim for n in after.nodes}
    assert claims["fused_nn_conv2d_add_nn_relu"] == "fallback"
    cfg = dpl.FusionConfig(min_tensor_elements=0)
    drawing = dpl.draw(dpl.load(EXAMPLES / "conv_block.ir"), ["llm"], config=cfg)
    assert {n.name: n.claim for n in drawing.views[0][1].nodes}["fused_nn_conv2d_add_nn_relu"] == "automatic"


def test_torch_nn_models_draw(tmp_path):
    torch = needs.package("torch")
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16), nn.LayerNorm(16)).eval()
    mod = dpl.from_torch(model, (torch.randn(4, 16),))
    trace = dpl.Trace()
    dpl.apply(mod, ["rewrites", "llm"], trace=trace)
    path = dpl.draw(None, trace=trace).save(tmp_path / "mlp.html")
    check_page(Path(path).read_text(), trace)


def test_dpl_demo_runs_checks_times_and_writes_the_picture(tmp_path, capsys):
    out = tmp_path / "demo.html"
    assert dpl_main(["demo", "-o", str(out), "--budget", "0.05"]) == 0
    text, err = capsys.readouterr()
    assert "-> OK" in text
    for stage in ("rewrites", "composites", "automatic fusion", "speed-up", "coverage of 'main'", "kernel.attention"):
        assert stage in text
    # the file written is said on stderr, as every command that writes one says it
    assert f"dpl: wrote the picture: {out}" in err and out.stat().st_size > 10_000
    fused_ms, unfused_ms = (float(x) for x in re.findall(r"(\d+\.\d+) ms", text)[:2])
    assert fused_ms > 0 and unfused_ms > 0


def layered(k: int) -> str:
    """A k-layer model in the text form: each layer matmul, relu, residual add, RMSNorm."""
    params = ["x: f32[n, 32]"] + [f"w{i}: f32[32, 32], g{i}: f32[32]" for i in range(k)]
    body, h = [], "x"
    for i in range(k):
        body += [f"  m{i} = matmul({h}, w{i})", f"  r{i} = nn.relu(m{i})", f"  s{i} = add(r{i}, {h})", f"  h{i} = nn.rms_norm(s{i}, g{i})"]
        h = f"h{i}"
    return "func main(" + ", ".join(params) + ") -> f32[n, 32] {\n" + "\n".join(body) + f"\n  return {h}\n}}"


def test_repeated_layers_collapse_and_the_rest_stays():
    from dpl.viz.graph import collapse_repeats, find_repeat

    assert find_repeat(list("abcxyzxyzxyzq")) is None  # 6 boxes hidden: not worth it
    assert find_repeat(list("abcxyzxyzxyzxyzq")) == (3, 3, 4)
    assert find_repeat(list("abcdefg")) is None
    drawing = dpl.draw(dpl.parse(layered(12)), ["llm"], sources=False)
    before, after = drawing.views[0]
    short = collapse_repeats(after)
    placeholders = [n for n in short.nodes if n.claim == "repeat"]
    assert len(placeholders) == 1 and placeholders[0].title == "x11 more like the layer above"
    # one layer stays (its automatic group and its composite), the weights of the others go
    assert sum(n.claim in ("automatic", "fallback", "composite") for n in short.nodes) == 2
    assert {n.name for n in short.nodes if n.claim == "input"} == {"x", "w0", "g0"}
    assert any(e.dst == placeholders[0].id for e in short.edges) and any(e.src == placeholders[0].id for e in short.edges)
    assert collapse_repeats(before) is not None
    page = drawing.html()
    assert 'id="collapse" checked' in page and "x11 more like the layer above" in page
    assert all("fused" in n.name for n in after.nodes if n.claim in ("automatic", "fallback", "composite"))


def test_a_product_shows_what_the_packed_routine_folds_into_it():
    """The kernel source of a product group says which epilogue the packed routine applies to
    its tiles, and the C after it no longer computes it; a product it does not fold stays plain."""
    from dpl.viz.kernels import kernel_source

    import numpy as np

    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((128, 256)).astype(np.float32), "bias": rng.standard_normal(256).astype(np.float32)}
    mod = dpl.parse("""
const w: f32[128, 256]
const bias: f32[256]
func main(x: f32[64, 128]) -> f32[64, 256] {
  h = matmul(x, w)
  b = add(h, bias)
  y = nn.gelu(b)
  z = exp(y)
  return z
}""", constants=weights)
    fused = dpl.apply(mod, ["cublas"])
    product = next(f for f in fused.functions.values() if f.attrs.get("Composite", "").startswith("cublas."))
    source = kernel_source(product, fused)
    assert "applies + bias, nn.gelu to each tile" in source
    assert "erf(" not in source  # gelu is in the product, not in a kernel after it
    plain = dpl.parse("""
func main(x: f32[64, 128], w: f32[128, 256]) -> f32[64, 256] {
  h = matmul(x, w)
  y = add(h, h)
  return y
}""")
    fused = dpl.fuse_ops(plain, dpl.FusionConfig(min_nodes_for_fusion=1, min_tensor_elements=0))
    group = next(f for name, f in fused.functions.items() if name != "main")
    assert "a matrix product, computed by BLAS */" in kernel_source(group, fused)


def test_a_convolution_shows_what_the_direct_routine_folds_into_it():
    """A ResNet block claimed by the `cnn` library: its kernel source says the direct convolution
    applies the BatchNorm's per-channel steps and the ReLU, and leaves no C after it."""
    from dpl.viz.kernels import kernel_source

    import numpy as np

    rng = np.random.default_rng(0)
    weights = {"w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
               **{k: rng.uniform(0.5, 1.5, (8, 1, 1)).astype(np.float32) for k in ("m", "s", "g", "b")}}
    mod = dpl.parse("""
const w: f32[8, 4, 3, 3]
const m: f32[8, 1, 1]
const s: f32[8, 1, 1]
const g: f32[8, 1, 1]
const b: f32[8, 1, 1]
func main(x: f32[1, 4, 16, 16]) -> f32[1, 8, 16, 16] {
  c = nn.conv2d(x, w, padding=[1, 1])
  d = subtract(c, m)
  e = multiply(d, s)
  f = multiply(e, g)
  n = add(f, b)
  y = nn.relu(n)
  return y
}""", constants=weights)
    fused = dpl.apply(mod, ["cnn"])
    block = next(f for f in fused.functions.values() if f.attrs.get("Composite") == "kernel.conv2d_bn_relu")
    source = kernel_source(block, fused)
    assert "direct routine, which applies subtract per channel, multiply per channel, multiply per channel, " \
           "add per channel, nn.relu to each tile" in source, source
    assert "generated C" not in source  # nothing left after it


def test_the_svg_has_a_legend_of_its_colours():
    """Graphviz's picture says what each colour means, as the HTML page's header does."""
    needs.package("graphviz")
    drawing = dpl.draw(dpl.load(EXAMPLES / "llama_mlp.ir"), ["llm"])
    source = drawing.dot().source
    assert "cluster_legend" in source
    for words in ("claimed by a composite pattern", "automatic fusion (FuseOps)", "alone: no group claimed it",
                  "fallen back: runs op by op at run time", "kernel.swiglu"):
        assert f'label="{words}"' in source


def test_the_page_zooms_and_fits_with_nothing_fetched():
    page = dpl.draw(dpl.parse(layered(12)), ["llm"], sources=False).html()
    for control in ('id="zoom-in"', 'id="zoom-out"', 'id="zoom-fit"', 'id="zoom-reset"', "addEventListener('wheel'"):
        assert control in page
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg" class="graph"') == 4  # before and after, each collapsed too
    assert "<script src" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
