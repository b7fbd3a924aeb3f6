"""The model zoo (tests/zoo.py) end to end: dpl against torch eager, torch.compile, ONNX Runtime
and OpenVINO, one process per model and thread count, at 1 and 2 threads.

    python bench/bench_zoo.py                          # the ten required architectures, 1 and 2 threads
    python bench/bench_zoo.py --models llama,resnet --threads 1 --shapes 1x128
    python bench/bench_zoo.py --hidden 512 --layers 4  # bigger models
    python bench/bench_zoo.py --smoke                  # the zoo's own tiny configs, one small shape
    python bench/bench_zoo.py --json out.json          # also every number, as JSON
    python bench/bench_zoo.py --models gpt2,resnet --threads 1 --smoke --no-compile --settle 0.2  # peers' smoke check

Each architecture is the zoo's (a Hugging Face transformers model from its config, random seeded
weights, ``sdpa`` attention, called the stock way: ``model(input_ids, attention_mask=...)`` with
every second row left-padded, or ``model(pixel_values)``), resized to ``--hidden`` (default 256:
every width of the zoo's hidden-64 config scaled by hidden / 64, heads unchanged) and
``--layers`` (default 2), as in issue 17's figures. Text models run at each ``--shapes`` entry
BATCHxSEQ (default 1x128, 1x512, 8x128); ResNet and ViT at the batches those entries name (1
and 8) on 224x224 images (ViT with 16x16 patches: 196 tokens). ``--smoke`` keeps the zoo's tiny
configs and its 32x32 images at one shape (1x16) with few repeats: a check that the bench runs.

Per model, in a fresh process for each thread count (so that neither inductor's caches nor a
thread pool leaks from one model into the next), and per shape:

- dpl: ``dpl.from_torch(model, (), inputs)`` (a static import at the shape) ->
  ``dpl.apply(mod, ["rewrites", "llm", "cublas", "cnn"], convert_layout=True)`` (every shipped
  library; convolutions channels-last, as the CPU's own convolution wants them: a no-op for a model
  without one) -> ``dpl.build(fused, target, threads=N)``
  where the target is ``"cpu"``'s backends with the C kernel cache in a fresh directory (build
  cold: the C compiles; build warm: the same again, kernels from that directory). The timed call
  is the plain one users write, ``exe(*arrays)``, fresh outputs each time.
- torch eager: ``model(**inputs)`` under ``torch.no_grad``, ``torch.set_num_threads(N)``.
- torch.compile: ``torch.compile(model, dynamic=False)`` (inductor, caches in a fresh directory;
  its first call is its build), recompiled at each shape.
- ONNX Runtime and OpenVINO (the optional ``bench`` extra; ``--peers`` picks them): one
  ``torch.onnx.export(dynamo=True)`` of the model at the shape, the same file for both, each on
  N threads (bench/peers.py says how). An engine that is not installed says so in its column.

dpl's outputs are checked against torch eager first (max abs error printed; ``!`` marks one
outside rtol 1e-3 / atol 1e-4, which is then reported on stderr), and so are each peer's (``!``
after its time: it computed something else, and is left out of dpl/peer). The runs are
interleaved (dpl, eager, compile, ONNX Runtime, OpenVINO, dpl, ...), ``--settle`` seconds of
sleep after each sample (so one engine's spinning threads have stopped before the next starts),
each sample long enough to be timed (>= 20 ms of calls), and the tables give the medians of
``--repeat`` samples per contender and the ratios dpl/eager, dpl/compile and dpl / the faster
peer (< 1: dpl is faster), and dpl's time at N threads over its time at 1 (dpl/1thr; issue 17
asks for <= 1). Every table is headed by the CPU's model and instruction sets. A third table holds each row against this machine's arithmetic floor
(bench/roofline.py): the products' and convolutions' flops as written, at the float32 FMA peak
of one core measured in the child times its thread count, and the share of that peak dpl, eager,
torch.compile and issue 17's target (0.85 x torch.compile's time) use. dpl's fall-backs (``exe.fallbacks``) are listed after the
tables. The host is shared: quote the load average beside the numbers (printed at the top).

Measured (issue 17) on the shared 2-core bench host, torch 2.13.0 CPU, the defaults, every
default shape at one and two threads, ``--repeat 7``, load average 0.2-1.3 (stop 27: the
packed products fold their activations and a gated MLP's gated unit, transposing tiles turned
in registers, merged axes as contiguous loops; the whole table, and the earlier runs, are in
docs/architecture.md, "The zoo benchmark"), dpl/compile (dpl/eager) as ranges over the eight
text models, then ViT and ResNet at batch 1 / 8:

    threads  1x128                     1x512                     8x128                     ViT          ResNet
    1        0.77-0.88 (0.64-0.75)     0.76-0.94 (0.69-0.89)     0.88-1.00 (0.71-0.90)     0.86 / 0.97  1.22 / 1.17
    2        0.73-0.89 (0.51-0.74)     0.77-0.98 (0.69-0.92)     0.87-1.15 (0.72-0.98)     0.85 / 0.99  1.31 / 1.26

dpl at or under 0.85x torch.compile on 22 of the 56 rows (stop 26: 9). dpl at two threads took
0.52-0.93 of its one-thread time on every row (median 0.66). Warm builds 7-19 ms (median 10).
The roofline table: at 8x128 and one thread dpl used 69-78% of the FMA peak, torch.compile
67-71%, and 0.85x compile would take 79-83%.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import attrs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from zoo import ARCHS, torch_outputs  # noqa: E402

import peers  # noqa: E402  (bench/, beside this file)
from roofline import MARCH_LIBRARIES, fma_peak, product_flops  # noqa: E402  (bench/, beside this file)

MODELS = ["llama", "qwen2", "mistral", "phi3", "gpt2", "opt", "bert", "t5", "vit", "resnet"]
PATTERNS = ["rewrites", "llm", "cublas", "cnn"]
SHAPES = "1x128,1x512,8x128"
SMOKE_SHAPES = "1x16"
RTOL, ATOL = 1e-3, 1e-4
SAMPLE_S = 0.02  # each timed sample runs the call this long at least
WARM_CALLS = 5  # calls of each contender before its calls per sample are set (interleaved)

# the zoo's config keys (hidden 64), by what they measure
WIDTHS = {"hidden_size", "intermediate_size", "n_embd", "ffn_dim", "word_embed_proj_dim", "d_model", "d_kv", "d_ff",
          "head_dim", "dim", "hidden_dim", "embedding_size", "hidden_sizes"}
DEPTHS = {"num_hidden_layers", "n_layer", "num_layers", "n_layers"}
POSITIONS = {"max_position_embeddings", "n_positions"}


def resized(arch, hidden: int, layers: int, max_seq: int, image: int):
    """The zoo's architecture with every width scaled by ``hidden`` / 64, ``layers`` layers,
    room for ``max_seq`` positions and (vision) ``image``-pixel images; heads unchanged."""
    scale = hidden / 64
    kwargs = {}
    for key, value in arch.kwargs.items():
        if key in WIDTHS and value is not None:
            value = [round(v * scale) for v in value] if isinstance(value, list) else round(value * scale)
        elif key in DEPTHS:
            value = layers
        elif key in POSITIONS:
            value = max(value, max_seq + 2)  # RoBERTa-style models offset positions by the padding id
        kwargs[key] = value
    if arch.vision:
        kwargs["image_size"] = image
        if "patch_size" in kwargs:
            kwargs["patch_size"] = 16
    return attrs.evolve(arch, kwargs=kwargs)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for item in text.split(","):
        try:
            batch, seq = (int(x) for x in item.strip().lower().split("x"))
        except ValueError:
            raise SystemExit(f"bench_zoo: --shapes takes BATCHxSEQ entries separated by commas, got {item!r}") from None
        shapes.append((batch, seq))
    return shapes


def model_shapes(arch, shapes) -> list[tuple[str, dict]]:
    """(label, stock inputs) per shape: BxS for text, the distinct batches for images."""
    if not arch.vision:
        return [(f"{b}x{s}", arch.inputs(s, mask=arch.mask, batch=b)) for b, s in shapes]
    size = arch.kwargs.get("image_size", 32)
    return [(f"{b}x3x{size}x{size}", arch.inputs(b)) for b in sorted({b for b, _ in shapes})]


# -- one process: one model, one thread count --------------------------------------------------------


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - start) * 1e3


def interleaved(contenders: dict, repeat: int, settle: float = 0.0) -> dict[str, float]:
    """Median ms per call of each contender, sampled in turn ``repeat`` times; a sample runs as
    many calls as take ``SAMPLE_S``, and ``settle`` seconds of sleep follow each."""
    counts = {}
    for name, fn in contenders.items():
        # the calls per sample from the median of warm calls: one early call's time (dpl's thread
        # count still being chosen, a prepared call made at its first call) had set two calls a
        # sample, and a sample of two after the settle measured mostly the wake-up of its threads
        # (Llama 1x128 at 2 threads: 2.3-3.6 ms a call in the table, 1.4 in a loop of calls)
        time.sleep(settle)  # the peers' threads (a session just made and checked) quiet before its first calls too:
        for _ in range(WARM_CALLS):  # dpl's thread choice timed its first two-thread call at 26 ms beside them
            fn()
        ms = statistics.median(timed(fn)[1] for _ in range(3))
        counts[name] = max(1, math.ceil(SAMPLE_S * 1e3 / max(ms, 1e-3)))
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, fn in contenders.items():
            time.sleep(settle)
            start = time.perf_counter()
            for _ in range(counts[name]):
                fn()
            samples[name].append((time.perf_counter() - start) * 1e3 / counts[name])
    return {name: statistics.median(s) for name, s in samples.items()}


def max_errors(got, want) -> tuple[float, bool]:
    """The largest absolute difference over all outputs, and whether they all agree."""
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    if len(got) != len(want):
        return math.inf, False
    err, ok = 0.0, True
    for g, w in zip(got, want):
        g = np.asarray(g)
        if g.shape != w.shape:
            return math.inf, False
        err = max(err, float(np.max(np.abs(g.astype(np.float64) - w))) if w.size else 0.0)
        ok = ok and bool(np.allclose(g, w, rtol=RTOL, atol=ATOL))
    return err, ok


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def add_peers(torch, model, inputs, want, threads, engines, cache_root, row, contenders) -> None:
    """Each of ``engines`` (bench/peers.py) fed one ONNX export of ``model``, checked against
    ``want`` and added to ``contenders``; a missing package, a failed export or session and a
    mismatch are recorded in ``row``, never raised."""
    ready = []
    for engine in engines:
        why = peers.missing(engine)
        if why is not None:
            row[f"{engine}_missing"] = why
        else:
            ready.append(engine)
    if not ready:
        return
    path = Path(tempfile.mkdtemp(dir=cache_root)) / "model.onnx"
    try:
        _, row["export_ms"] = timed(lambda: peers.export(torch, model, inputs, path))
    except Exception as err:  # the exporter's failure is a finding about the peers' input, not dpl's
        for engine in ready:
            row[f"{engine}_error"] = f"export: {first_line(err)}"
        return
    feeds = {name: value.numpy() for name, value in inputs.items()}
    for engine in ready:
        try:
            run = peers.session(engine, path, threads)
            row[f"{engine}_max_err"], row[f"{engine}_ok"] = max_errors(run(feeds), want)
        except Exception as err:  # an engine that cannot take the export: its cell says so
            row[f"{engine}_error"] = first_line(err)
            continue
        contenders[engine] = lambda run=run: run(feeds)


def bench_shape(torch, dpl, CpuBackend, arch, model, label, inputs, threads, repeat, compile_too, cache_root, peak,
                engines=(), settle=0.0, march="native"):
    """One row: dpl's costs and check, the peers' checks, then the interleaved runs."""
    row = {"model": arch.name, "shape": label, "threads": threads, "peak_gflops": peak / 1e9, "march": march}
    want = torch_outputs(model, inputs)
    arrays = [v.numpy() for v in inputs.values()]
    contenders = {}
    try:
        stage = "import"
        mod, row["import_ms"] = timed(lambda: dpl.from_torch(model, (), inputs))
        row["gflop"] = product_flops(mod) / 1e9
        stage = "apply"
        fused, row["apply_ms"] = timed(lambda: dpl.apply(mod, PATTERNS, convert_layout=True))
        stage = "build"
        cache_dir = tempfile.mkdtemp(dir=cache_root)

        def build():
            return dpl.build(fused, [CpuBackend(cache_dir=cache_dir, march=march), "numpy"], threads=threads, progress=False)

        _, row["build_cold_ms"] = timed(build)
        exe, row["build_warm_ms"] = timed(build)
        row["fallbacks"] = [str(f) for f in exe.fallbacks]
        stage = "run"
        row["max_err"], row["ok"] = max_errors(exe(*arrays), want)
        contenders["dpl"] = lambda: exe(*arrays)
    except Exception as err:  # a failing stage is a finding: record it, time torch anyway
        row["dpl_error"] = f"{stage}: {first_line(err)}"
    contenders["eager"] = lambda: model(**inputs)
    if compile_too:
        torch._dynamo.reset()
        compiled = torch.compile(model, dynamic=False)
        try:
            _, row["compile_first_ms"] = timed(lambda: compiled(**inputs))
            contenders["compile"] = lambda: compiled(**inputs)
        except Exception as err:  # inductor needs a working C++ toolchain; report, do not crash
            row["compile_error"] = first_line(err)
    add_peers(torch, model, inputs, want, threads, engines, cache_root, row, contenders)
    row.update({f"{name}_ms": ms for name, ms in interleaved(contenders, repeat, settle).items()})
    return row


def child(opts) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench_zoo_inductor_") as inductor_dir:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", inductor_dir)  # cold, as bench_models.py times it
        return child_rows(opts)


def child_rows(opts) -> list[dict]:
    import torch

    import dpl
    from dpl.backends.cpu.backend import CpuBackend, KernelCache

    warnings.filterwarnings("ignore")
    torch.set_num_threads(opts.threads)
    shapes = parse_shapes(opts.shapes)
    arch = ARCHS[opts.child]
    if not opts.smoke:
        arch = resized(arch, opts.hidden, opts.layers, max(s for _, s in shapes), opts.image)
    model = arch.build("sdpa")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_zoo_kernels_") as cache_root, torch.no_grad():
        # the machine's peak for the row's threads: one core's, measured, times the threads (a
        # probe of several threads on a shared host measures the other processes too)
        peak = fma_peak(1, KernelCache(Path(cache_root) / "probe", march=opts.march)) * opts.threads
        for label, inputs in model_shapes(arch, shapes):
            rows.append(bench_shape(torch, dpl, CpuBackend, arch, model, label, inputs, opts.threads, opts.repeat,
                                    not opts.no_compile, cache_root, peak, parse_peers(opts.peers), opts.settle, opts.march))
    return rows


# -- the driver: a process per model and thread count, then the tables ---------------------------------


def run_child(model: str, threads: int, opts) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="bench_zoo_") as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, __file__, "--child", model, "--threads", str(threads), "--shapes", opts.shapes,
               "--repeat", str(opts.repeat), "--hidden", str(opts.hidden), "--layers", str(opts.layers),
               "--image", str(opts.image), "--json", str(out), "--peers", opts.peers, "--settle", str(opts.settle),
               "--march", opts.march]
        cmd += ["--smoke"] * opts.smoke + ["--no-compile"] * opts.no_compile
        env = {**os.environ, **MARCH_LIBRARIES.get(opts.march, {})}
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        if proc.returncode != 0 or not out.exists():
            tail = proc.stdout.strip().splitlines()[-1:] or [""]
            return [{"model": model, "threads": threads, "shape": "-", "dpl_error": f"process exited {proc.returncode}: {tail[0]}"}]
        return json.loads(out.read_text())


def cell(row, key, fmt):
    return format(row[key], fmt) if isinstance(row.get(key), (int, float)) else "-"


def ratio(row, a, b):
    return f"{row[a] / row[b]:.2f}" if row.get(a) and row.get(b) else "-"


def parse_peers(text: str) -> list[str]:
    engines = [e.strip() for e in text.split(",") if e.strip()]
    unknown = [e for e in engines if e not in peers.ENGINES]
    if unknown:
        raise SystemExit(f"bench_zoo: --peers takes {', '.join(peers.ENGINES)} (comma-separated, or ''), got {', '.join(unknown)}")
    return engines


def peer_cell(row, engine) -> str:
    """A peer's ms, ``!`` after it where its outputs did not match torch's; else why there is none."""
    if isinstance(row.get(f"{engine}_ms"), (int, float)):
        return f"{row[f'{engine}_ms']:.2f}{'' if row.get(f'{engine}_ok') else '!'}"
    if f"{engine}_missing" in row:
        return "absent"
    return "error" if f"{engine}_error" in row else "-"


def best_peer_ms(row) -> float | None:
    """The faster peer's ms among those whose outputs matched torch's."""
    times = [row[f"{e}_ms"] for e in peers.ENGINES if isinstance(row.get(f"{e}_ms"), (int, float)) and row.get(f"{e}_ok")]
    return min(times) if times else None


def print_cpu(cpu: str, out, rows=()) -> None:
    print(f"CPU: {cpu}", file=out)
    for march in sorted({r.get("march", "native") for r in rows} - {"native"}):
        held = ", ".join(f"{k}={v}" for k, v in MARCH_LIBRARIES.get(march, {}).items())
        print(f"dpl's C built for -march={march}" + (f"; torch's libraries held to it ({held})" if held else "")
              + "; ONNX Runtime's and OpenVINO's products keep this CPU's own instruction sets", file=out)


def print_tables(rows, out=sys.stdout, cpu: str | None = None):
    """The tables of ``rows``, each headed by ``cpu`` (the CPU they were measured on; default this one's)."""
    from dpl.host_cpu import describe

    cpu = cpu or describe()
    one = {(r["model"], r["shape"]): r for r in rows if r["threads"] == 1}
    print_cpu(cpu, out, rows)
    print(f"{'model':8} {'shape':14} {'thr':>3} {'dpl ms':>9} {'eager ms':>9} {'compile ms':>10} {'ort ms':>9} {'ov ms':>9} "
          f"{'dpl/eager':>9} {'dpl/comp':>8} {'dpl/peer':>8} {'max err':>9} {'dpl/1thr':>8}", file=out)
    for r in rows:
        err = "-" if "max_err" not in r else f"{r['max_err']:.1e}{'' if r['ok'] else '!'}"
        base = one.get((r["model"], r["shape"]), {}) if r["threads"] != 1 else {}
        scaling = f"{r['dpl_ms'] / base['dpl_ms']:.2f}" if r.get("dpl_ms") and base.get("dpl_ms") else ""
        best = best_peer_ms(r)
        vs_peer = f"{r['dpl_ms'] / best:.2f}" if r.get("dpl_ms") and best else "-"
        print(f"{r['model']:8} {r['shape']:14} {r['threads']:3d} {cell(r, 'dpl_ms', '9.2f'):>9} {cell(r, 'eager_ms', '9.2f'):>9} "
              f"{cell(r, 'compile_ms', '10.2f'):>10} {peer_cell(r, 'ort'):>9} {peer_cell(r, 'openvino'):>9} "
              f"{ratio(r, 'dpl_ms', 'eager_ms'):>9} {ratio(r, 'dpl_ms', 'compile_ms'):>8} {vs_peer:>8} {err:>9} "
              f"{scaling:>8}", file=out)
    print("\nwhat it costs to get there, ms (dpl's import, apply, build with a fresh kernel cache and again warm;"
          " torch.compile's first call; the peers' ONNX export)", file=out)
    print_cpu(cpu, out, rows)
    print(f"{'model':8} {'shape':14} {'thr':>3} {'import':>8} {'apply':>8} {'build cold':>10} {'build warm':>10} {'compile 1st':>11} "
          f"{'export':>8}", file=out)
    for r in rows:
        print(f"{r['model']:8} {r['shape']:14} {r['threads']:3d} {cell(r, 'import_ms', '8.0f'):>8} {cell(r, 'apply_ms', '8.0f'):>8} "
              f"{cell(r, 'build_cold_ms', '10.0f'):>10} {cell(r, 'build_warm_ms', '10.1f'):>10} {cell(r, 'compile_first_ms', '11.0f'):>11} "
              f"{cell(r, 'export_ms', '8.0f'):>8}", file=out)
    print_roofline(rows, out, cpu)
    keys = ("dpl_error", "compile_error", *(f"{e}_{why}" for e in peers.ENGINES for why in ("error", "missing")))
    notes = sorted({f"{r['model']} {r['shape']} threads {r['threads']}: {k}: {r[k]}" for r in rows for k in keys if k in r})
    by_fallback: dict[str, list[str]] = {}
    for r in rows:
        for f in r.get("fallbacks", ()):
            if r["model"] not in by_fallback.setdefault(f, []):
                by_fallback[f].append(r["model"])
    falls = [f"{f}  [{', '.join(models)}]" for f, models in sorted(by_fallback.items())]
    bad = sorted({f"{r['model']} {r['shape']} threads {r['threads']}: {who}max err {r[f'{key}max_err']:.2e}" for r in rows
                  for who, key in [("", ""), *((f"{e}: ", f"{e}_") for e in peers.ENGINES)] if r.get(f"{key}ok") is False})
    print("\ndpl's fall-backs, failures and mismatches:", file=out)
    for line in notes + falls + bad or ["none"]:
        print(f"  {line}", file=out)


def share(row, key, peak_ms):
    """The share of the FMA peak a run at ``row[key]`` ms used, as a percentage."""
    return f"{100 * peak_ms / row[key]:.0f}%" if row.get(key) and peak_ms else "-"


def print_roofline(rows, out, cpu: str):
    """Each row against the floor of bench/roofline.py: its products' flops at this machine's
    FMA peak for the row's threads, the share of that peak each contender used, and the share
    issue 17's target (0.85 x torch.compile's time) asks for."""
    peaks = sorted({f"{r['peak_gflops']:.0f} at {r['threads']}" for r in rows if r.get("peak_gflops")})
    print(f"\nagainst the float32 FMA peak (GFLOP/s at threads: {', '.join(peaks) or '-'}): the products' and"
          " convolutions' flops as written, the floor they set, the share of the peak each run used", file=out)
    print_cpu(cpu, out, rows)
    print(f"{'model':8} {'shape':14} {'thr':>3} {'GFLOP':>7} {'floor ms':>9} {'dpl':>5} {'eager':>6} {'compile':>7} "
          f"{'0.85 x compile':>14}", file=out)
    for r in rows:
        floor = r["gflop"] / r["peak_gflops"] * 1e3 if r.get("gflop") and r.get("peak_gflops") else None
        target = {"target_ms": 0.85 * r["compile_ms"]} if r.get("compile_ms") else {}
        print(f"{r['model']:8} {r['shape']:14} {r['threads']:3d} {cell(r, 'gflop', '7.3f'):>7} "
              f"{'-' if floor is None else format(floor, '9.2f'):>9} {share(r, 'dpl_ms', floor):>5} "
              f"{share(r, 'eager_ms', floor):>6} {share(r, 'compile_ms', floor):>7} {share(target, 'target_ms', floor):>14}",
              file=out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"zoo architectures, comma-separated (default: {','.join(MODELS)})")
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated (default: 1,2)")
    parser.add_argument("--shapes", default=None, help=f"BATCHxSEQ entries (default: {SHAPES}; --smoke: {SMOKE_SHAPES})")
    parser.add_argument("--repeat", type=int, default=None, help="interleaved samples per contender (default: 10; --smoke: 3)")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size the zoo's configs are scaled to (default: 256)")
    parser.add_argument("--layers", type=int, default=2, help="layers (default: 2)")
    parser.add_argument("--image", type=int, default=224, help="image size of ResNet and ViT (default: 224)")
    parser.add_argument("--smoke", action="store_true", help="the zoo's tiny configs at one small shape, few repeats")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--peers", default=",".join(peers.ENGINES),
                        help=f"engines fed one ONNX export, comma-separated, '' for none (default: {','.join(peers.ENGINES)})")
    parser.add_argument("--settle", type=float, default=0.0, metavar="SECONDS",
                        help="sleep this long after each sample, so one engine's threads are idle before the next runs")
    parser.add_argument("--march", default="native",
                        help="the instruction sets dpl's C is built for (default: native, this CPU's; haswell: AVX2 and "
                             "FMA only, with torch's libraries held to AVX2 too, as on an AVX2 host)")
    parser.add_argument("--json", help="write every row to this file")
    parser.add_argument("--tables", metavar="JSON", help="print the tables of an earlier run's --json file and stop")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one model, in this process
    opts = parser.parse_args(argv)
    opts.shapes = opts.shapes or (SMOKE_SHAPES if opts.smoke else SHAPES)
    opts.repeat = opts.repeat or (3 if opts.smoke else 10)
    parse_shapes(opts.shapes)
    engines = parse_peers(opts.peers)
    if opts.settle < 0:
        parser.error("--settle takes seconds >= 0")
    if opts.tables:
        data = json.loads(Path(opts.tables).read_text())
        rows = data["rows"]
        order = list(dict.fromkeys(r["model"] for r in rows))
        print_tables(sorted(rows, key=lambda r: (order.index(r["model"]), r["shape"], r["threads"])), cpu=data.get("cpu"))
        return
    if opts.child:
        opts.threads = int(opts.threads)
        rows = child(opts)
        Path(opts.json).write_text(json.dumps(rows))
        return
    models = [m.strip() for m in opts.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in ARCHS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; the zoo has {', '.join(ARCHS)}")
    try:
        threads = [int(t) for t in opts.threads.split(",")]
    except ValueError:
        parser.error(f"--threads takes integers separated by commas, got {opts.threads!r}")
    from dpl.host_cpu import describe

    size = "the zoo's configs" if opts.smoke else f"hidden {opts.hidden}, {opts.layers} layers, images {opts.image}"
    versions = ", ".join(f"{peers.TITLES[e]} {peers.version(e)}" for e in engines) or "no peers"
    print(f"bench_zoo: {size}; shapes {opts.shapes}; median of {opts.repeat} interleaved samples, {opts.settle:g} s settle; "
          f"{versions}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)
    rows = []
    for model in models:
        for t in threads:
            start = time.perf_counter()
            rows.extend(run_child(model, t, opts))
            print(f"  {model} at {t} thread(s): {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
            if opts.json:  # after every model: a long run that stops early keeps what it measured
                options = {k: v for k, v in vars(opts).items() if k not in ("child", "tables")}
                Path(opts.json).write_text(json.dumps({"options": options, "cpu": describe(), "rows": rows}, indent=1))
    rows.sort(key=lambda r: (models.index(r["model"]), r["shape"], r["threads"]))
    print_tables(rows)
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
