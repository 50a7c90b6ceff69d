#!/usr/bin/env bash
# Runs the test suite with the venv's tools; MPI tests launch real `mpirun` jobs.
#   launch/run_tests.sh                 every tier, fastest first, each in its own pytest process
#   launch/run_tests.sh tests/unit -x   what you name, in one pytest process
# One process per tier: the kernels tier drives CUDA kernels' CPU emulation and C++ ops through raw
# pointers, and a fault there must fail that tier, not surface as a corrupted object in another
# tier's test (docs/architecture.md, "Tests").  Every tier runs even when an earlier one fails.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" GLOG_minloglevel=2 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
pytest=(.venv/bin/python -m pytest -q -p no:cacheprovider)
if [ $# -gt 0 ]; then
  exec "${pytest[@]}" "$@"
fi
# The C++ op library compiles once per source version (ops/paddle_ext.py caches it): build it here,
# so that no test's server start-up timeout includes a compile of a minute or more on a busy machine.
.venv/bin/python -W ignore -c "from ops import paddle_ext; print('C++ ops:', paddle_ext.library_path())"
failed=()
for tier in unit http graphs kernels mpi e2e; do
  echo "== tests/$tier"
  # the slowest tests in every CI log: where the suite's time goes (its budget is 15 minutes)
  "${pytest[@]}" --durations=15 "tests/$tier" || failed+=("$tier")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed tiers: ${failed[*]}"
  exit 1
fi
echo "== every tier passed"
