"""bench/bench_zoo.py: its resized configs, and a smoke run (the zoo's tiny GPT-2, one shape,
without torch.compile, whose first call alone takes longer than this test may) that must print
its tables with dpl's numbers checked against torch."""

import json
import subprocess
import sys
from pathlib import Path

import needs

needs.package("torch", module_level=True)
needs.package("transformers", module_level=True)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_zoo  # noqa: E402
from zoo import ARCHS  # noqa: E402


def test_resized_scales_every_width_and_keeps_the_heads():
    llama = bench_zoo.resized(ARCHS["llama"], 256, 3, 512, 224).kwargs
    assert (llama["hidden_size"], llama["intermediate_size"], llama["num_hidden_layers"]) == (256, 512, 3)
    assert (llama["num_attention_heads"], llama["num_key_value_heads"]) == (4, 2)
    assert llama["max_position_embeddings"] >= 512
    t5 = bench_zoo.resized(ARCHS["t5"], 128, 2, 128, 224).kwargs
    assert (t5["d_model"], t5["d_kv"] * t5["num_heads"], t5["d_ff"]) == (128, 128, 256)
    vit = bench_zoo.resized(ARCHS["vit"], 256, 2, 128, 224)
    assert (vit.kwargs["image_size"], vit.kwargs["patch_size"], vit.kwargs["hidden_size"]) == (224, 16, 256)
    assert bench_zoo.resized(ARCHS["resnet"], 256, 2, 128, 224).kwargs["hidden_sizes"] == [64, 128]
    assert ARCHS["llama"].kwargs["hidden_size"] == 64  # the zoo itself is left as it was


def test_shapes_give_text_rows_and_image_batches():
    shapes = bench_zoo.parse_shapes("1x16,2x8")
    assert [label for label, _ in bench_zoo.model_shapes(ARCHS["gpt2"], shapes)] == ["1x16", "2x8"]
    assert bench_zoo.model_shapes(ARCHS["gpt2"], shapes)[1][1]["input_ids"].shape == (2, 8)
    assert [label for label, _ in bench_zoo.model_shapes(ARCHS["vit"], shapes)] == ["1x3x32x32", "2x3x32x32"]


def test_smoke_run_prints_the_tables(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_zoo.py"), "--smoke", "--no-compile", "--models", "gpt2",
                           "--threads", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    row = next(line.split() for line in lines if line.startswith("gpt2 ") and "x16" in line)
    assert row[:3] == ["gpt2", "1x16", "1"]
    assert float(row[3]) > 0 and float(row[4]) > 0  # dpl ms, eager ms
    assert not row[-1].endswith("!")  # the max error is within tolerance
    assert any(line.startswith("what it costs") for line in lines)
    assert any(line.startswith("against the float32 FMA peak") for line in lines)
    (result,) = json.loads(out.read_text())["rows"]
    assert result["ok"] and result["max_err"] < 1e-4 and "dpl_error" not in result
    assert result["build_cold_ms"] > 0 and result["import_ms"] > 0
    assert result["gflop"] > 0 and result["peak_gflops"] > 1
