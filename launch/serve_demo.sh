#!/usr/bin/env bash
# Starts `mpirun -n $MP_NUM spmd_serve` in the foreground on the built-in demo model (made on
# first use under ~/.cache/spmd_serve/), after printing how to talk to it.  Ctrl-C stops every rank.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" GLOG_minloglevel="${GLOG_minloglevel:-2}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
n="${MP_NUM:-1}"
port="${SERVICE_HTTP_PORT:-${PUSH_MODE_HTTP_PORT:-9965}}"
cat <<MSG
Starting spmd_serve with $n rank(s) on the ${MODEL_DIR:-built-in demo} model (HTTP port $port).
When /v2/health/ready says ok, try:
  curl -s http://127.0.0.1:$port/v1/chat/completions -d '{"text": "Hello, how are you?", "max_dec_len": 32}'
  curl -sN http://127.0.0.1:$port/v1/chat/completions -d '{"text": "Hello", "max_dec_len": 32, "stream": true}'
MSG
exec mpirun -n "$n" --oversubscribe --bind-to none spmd_serve "$@"
