#!/usr/bin/env bash
# The GPU checks in one go, on a machine with a CUDA device, CuPy and a CUDA torch:
# the GPU suite, the row kernels' bandwidth, the CUDA benchmarks, where the CUDA time goes
# (bench/cuda_where.py). Logs go to $OUT (default ./gpu-logs). On an H100, 2026-11-28: 165 s.
# Wheels of missing pure-Python dependencies (lark, platformdirs) may sit in .whl/.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
T0=$(date +%s); step() { echo "== +$(( $(date +%s) - T0 ))s $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/env.txt"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >"$OUT/pip.txt" 2>&1 || tail -5 "$OUT/pip.txt"
step "pytest -m gpu"
timeout "${PT:-200}" python3 -m pytest -m gpu -q -rs -n "${WORKERS:-8}" -p no:cacheprovider --durations=12 tests/test_gpu.py >"$OUT/pytest.txt" 2>&1
echo "pytest rc=$?"; tail -25 "$OUT/pytest.txt"
step "bench/cuda_rows.py"
timeout 60 python3 bench/cuda_rows.py >"$OUT/rows.txt" 2>&1; echo "rows rc=$?"; cat "$OUT/rows.txt"
step "bench/bench_cuda.py --models"
timeout "${BT:-170}" python3 bench/bench_cuda.py --models >"$OUT/bench.txt" 2>&1; echo "bench rc=$?"; grep -v -i warn "$OUT/bench.txt" | tail -60
step "bench/cuda_where.py"
timeout "${WT:-90}" python3 bench/cuda_where.py >"$OUT/where.txt" 2>&1; echo "where rc=$?"; grep -v -i warn "$OUT/where.txt" | tail -20
step done
