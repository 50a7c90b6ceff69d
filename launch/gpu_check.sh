#!/usr/bin/env bash
# The GPU checks of docs/gpu.md on a machine with an NVIDIA driver, CUDA, cuda-python and cupy (no
# Paddle needed): every `gpu`-marked kernel test against its numpy twin, then `python -m ops.bench`
# (time and bandwidth against the measured copy bandwidth).  Logs go to $OUT (or ./gpu-check).
set -u
out=${OUT:-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
{
    nvidia-smi -L
    "$py" -c "import sys, numpy, cuda.bindings; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cuda.bindings', cuda.bindings.__version__)"
} 2>&1 | tee "$out/env.log"
timeout "${PYTEST_S:-300}" "$py" -m pytest -m gpu -p no:cacheprovider -q -rfE \
    tests/kernels/test_ops_*.py tests/kernels/test_device_kv_pool.py 2>&1 | tee "$out/pytest.log"
timeout "${BENCH_S:-200}" "$py" -m ops.bench 2>&1 | tee "$out/bench.log"
