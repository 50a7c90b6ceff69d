#!/usr/bin/env bash
# The GPU checks of docs/gpu.md on a machine with an NVIDIA driver, CUDA, cuda-python and cupy (no
# Paddle needed): every `gpu`-marked kernel test against its numpy twin, then `python -m ops.bench`
# (time and bandwidth against the measured copy bandwidth).  Logs go to $OUT (or ./gpu-check).
# The kernels new to a device run first, each group in a process of its own, and the bench runs one
# process per section: a fault that poisons a CUDA context cannot hide the other figures, and a
# lease that ends early has measured what is new.
set -u
out=${OUT:-gpu-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
{
    nvidia-smi -L
    "$py" -c "import sys, numpy, cuda.bindings; print(sys.version.split()[0], 'numpy', numpy.__version__, 'cuda.bindings', cuda.bindings.__version__)"
} 2>&1 | tee "$out/env.log"
tests=(tests/kernels/test_ops_*.py tests/kernels/test_device_kv_pool.py)
new_groups=("kv_cache_write or paged_attention or device_pool")  # pytest -k: kernels changed since the last lease
gpu_tests() { timeout "${PYTEST_S:-150}" "$py" -m pytest -m gpu -p no:cacheprovider -q -rfE "${tests[@]}" -k "$1" 2>&1; }
bench() { timeout "${BENCH_S:-120}" "$py" -m ops.bench "$1" 2>&1 | tee -a "$out/bench.log"; }
for expr in "${new_groups[@]}"; do
    echo "== gpu tests: $expr" | tee -a "$out/pytest.log"
    gpu_tests "$expr" | tee -a "$out/pytest.log"
done
bench attention
bench kv
bench variants
old="not ($(printf '%s) and not (' "${new_groups[@]}" | sed 's/ and not ($//')"
echo "== gpu tests: $old" | tee -a "$out/pytest.log"
gpu_tests "$old" | tee -a "$out/pytest.log"
bench sample
bench sample_phases
