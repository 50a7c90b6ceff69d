#!/usr/bin/env bash
# Runs the whole test suite with the venv's tools; MPI tests launch real `mpirun` jobs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" GLOG_minloglevel=2 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
