#!/usr/bin/env bash
# Runs the test suite with the venv's tools; MPI tests launch real `mpirun` jobs.
#   launch/run_tests.sh                 every tier, each in its own pytest process, in two lanes (TEST_LANES=1: in turn)
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
# the project's own modules as bytecode too (launch/install.sh compiles site-packages): where
# PYTHONDONTWRITEBYTECODE is set, each of the suite's ~hundreds of processes would compile them again
.venv/bin/python -m compileall -q spmd_serve ops tests benchmarks > /dev/null
# Two lanes by default: the mpi tier (half its time is one busy core: rank start-up, single-threaded
# exports, waits on a rank) beside the other tiers in order (~22 -> ~14 min on 2 cores). Each lane
# takes its test servers' ports from a slice of its own below the ephemeral range
# (SPMD_TEST_PORT_LANE, tests/support/server_process.free_ports): a port one lane checked free and
# released cannot be taken by the other before its server binds it. TEST_LANES=1: every tier in turn.
# MPI_IN_LANE0: mpi files run in the first lane after e2e, to end both lanes together. Empty since
# session 17 made the mpi lane the shorter one (quiet: lane 0 ~620 s with the bench file's 31 s,
# the mpi lane 533 s; beside two hogs 1,466 s vs 1,140 s).
MPI_IN_LANE0=()
run_tier() {  # run_tier LABEL [PYTEST ARGS...]; the args default to the LABEL (a tests/ folder)
  local label=$1
  shift
  [ $# -gt 0 ] || set -- "$label"
  echo "== $label ($(date +%T))"
  # the slowest tests and each tier's CPU seconds (its processes and theirs: the ranks, the
  # servers) in every CI log: where the suite's time goes on 2 cores (its budget is 15 minutes)
  local TIMEFORMAT="== $label: %0R s wall, %0U s user + %0S s sys CPU"
  # in a subshell: bash adds the CPU of a background job it reaps meanwhile (the other lane) to `time`
  (time "${pytest[@]}" --durations=15 "$@")
}
failed=()
if [ "${TEST_LANES:-2}" = 1 ]; then
  tiers=(unit http graphs kernels mpi e2e)
else  # the mpi lane's log is held back until it ends, so the two lanes' lines do not interleave
  tiers=(unit http graphs kernels e2e)
  logs=$(mktemp -d)
  trap 'rm -rf "$logs"' EXIT
  (
    export SPMD_TEST_PORT_LANE=1
    run_tier tests/mpi tests/mpi "${MPI_IN_LANE0[@]/#/--ignore=}" > "$logs/mpi.log" 2>&1
    echo $? > "$logs/mpi.rc"
  ) &
  mpi_lane=$!
fi
for tier in "${tiers[@]}"; do
  run_tier "tests/$tier" || failed+=("$tier")
done
if [ -n "${mpi_lane:-}" ]; then
  if [ ${#MPI_IN_LANE0[@]} -gt 0 ]; then
    run_tier "tests/mpi (lane 0)" "${MPI_IN_LANE0[@]}" || failed+=("mpi (lane 0)")
  fi
  wait "$mpi_lane" || true
  cat "$logs/mpi.log"
  [ "$(cat "$logs/mpi.rc" 2>/dev/null)" = 0 ] || failed+=(mpi)
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "== failed tiers: ${failed[*]}"
  exit 1
fi
echo "== every tier passed ($(date +%T))"
