"""bench/bench_zoo.py: its resized configs, and a smoke run (the zoo's tiny GPT-2, one shape,
without torch.compile, whose first call alone takes longer than this test may) that must print
its tables with dpl's numbers checked against torch."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

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
    assert sum(line.startswith("CPU: ") for line in lines) == 3  # beside every table
    (result,) = json.loads(out.read_text())["rows"]
    assert result["ok"] and result["max_err"] < 1e-4 and "dpl_error" not in result
    for engine, column in (("ort", 6), ("openvino", 7)):  # the peers: timed and checked where installed
        if bench_zoo.peers.missing(engine):
            assert row[column] == "absent" and engine in result[f"{engine}_missing"]
        else:
            assert float(row[column]) > 0 and result[f"{engine}_ok"] and result[f"{engine}_max_err"] < 1e-4
    assert result["build_cold_ms"] > 0 and result["import_ms"] > 0
    assert result["gflop"] > 0 and result["peak_gflops"] > 1


def table_row(**fields):
    return {"model": "gpt2", "shape": "1x16", "threads": 1, "dpl_ms": 2.0, "eager_ms": 4.0, "max_err": 1e-6, "ok": True, **fields}


def test_the_peers_columns_say_absent_mismatched_and_the_ratio_to_the_faster_peer():
    import io

    rows = [table_row(ort_ms=1.0, ort_ok=False, ort_max_err=0.5, openvino_ms=4.0, openvino_ok=True, openvino_max_err=1e-7),
            table_row(shape="1x32", ort_missing="onnxruntime not installed", openvino_error="RuntimeError: no")]
    out = io.StringIO()
    bench_zoo.print_tables(rows, out, cpu="Some CPU, 2 cores, avx2 fma")
    text = out.getvalue()
    lines = text.splitlines()
    first, second = [line.split() for line in lines if line.startswith("gpt2 ")][:2]  # the first table's rows
    assert first[6:11] == ["1.00!", "4.00", "0.50", "-", "0.50"]  # ORT mismatched: out of dpl/peer (2.0 / 4.0)
    assert second[6:8] == ["absent", "error"] and second[10] == "-"
    assert text.count("CPU: Some CPU, 2 cores, avx2 fma\n") == 3
    assert "1x32 threads 1: ort_missing: onnxruntime not installed" in text
    assert "1x32 threads 1: openvino_error: RuntimeError: no" in text
    assert "1x16 threads 1: ort: max err 5.00e-01" in text


def test_a_missing_or_failing_peer_is_recorded_not_raised(monkeypatch, tmp_path):
    monkeypatch.setattr(bench_zoo.peers, "missing", lambda engine: "not installed" if engine == "ort" else None)
    monkeypatch.setattr(bench_zoo.peers, "export", lambda torch, model, inputs, path: path.write_bytes(b"onnx"))

    def session(engine, path, threads):
        raise RuntimeError(f"{engine} cannot read it")

    monkeypatch.setattr(bench_zoo.peers, "session", session)
    row, contenders = {}, {}
    bench_zoo.add_peers(None, None, {}, [], 1, ["ort", "openvino"], tmp_path, row, contenders)
    assert row["ort_missing"] == "not installed" and row["openvino_error"] == "RuntimeError: openvino cannot read it"
    assert contenders == {} and row["export_ms"] >= 0


def test_samples_are_interleaved_with_the_settle_between_them(monkeypatch):
    calls, sleeps = [], []
    monkeypatch.setattr(bench_zoo.time, "sleep", lambda s: (sleeps.append(s), calls.append("sleep")))
    monkeypatch.setattr(bench_zoo, "SAMPLE_S", 0.0)  # one call a sample
    medians = bench_zoo.interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, 2, settle=0.25)
    assert set(medians) == {"a", "b"}
    # each contender's warm and count calls after a settle of their own, then the samples in turns
    warm = ["sleep"] + ["a"] * (bench_zoo.WARM_CALLS + 3) + ["sleep"] + ["b"] * (bench_zoo.WARM_CALLS + 3)
    assert calls == warm + ["sleep", "a", "sleep", "b"] * 2 and sleeps == [0.25] * 6
    with pytest.raises(SystemExit, match="--peers takes ort, openvino"):
        bench_zoo.parse_peers("ort,tensorrt")


def test_a_march_run_says_what_was_held_to_it_beside_every_table():
    import io

    out = io.StringIO()
    bench_zoo.print_tables([table_row(march="haswell")], out, cpu="Some CPU, 2 cores, avx2 fma avx512f")
    said = [line for line in out.getvalue().splitlines() if line.startswith("dpl's C built for -march=haswell")]
    assert len(said) == 3 and "MKL_ENABLE_INSTRUCTIONS=AVX2" in said[0] and "OpenVINO's products keep" in said[0]
    native = io.StringIO()
    bench_zoo.print_tables([table_row()], native, cpu="Some CPU")
    assert "-march" not in native.getvalue()
