#!/usr/bin/env bash
# Entrypoint of the spmd_serve images:
#   docker run ... IMAGE [model_name]      start_server [model_name], then stay in the foreground
#   docker run ... IMAGE COMMAND [ARGS]    run COMMAND instead (bash, download_model, mpirun, ...)
# start_server starts `mpirun ... spmd_serve` in the background and returns once the server is
# ready; a container must keep a foreground process, so this script then follows server.log (for
# `docker logs`) until the job ends.  `docker stop` (SIGTERM) runs stop_server: the server stops
# admitting, drains in-flight requests for up to STOP_TIMEOUT seconds (default 60; give
# `docker stop -t` a few more), and exits.  The container's exit status is 0 after such a stop and
# 1 when the server failed or ended on its own.
set -uo pipefail

if [ $# -gt 0 ] && [ "${1#*/}" = "$1" ] && command -v "$1" >/dev/null 2>&1; then
  exec "$@"
fi

log_dir="${LOG_DIR:-${FD_LOG_DIR:-./log}}"
stop_timeout="${STOP_TIMEOUT:-60}"

start_server "$@" || exit $?

pid="$(head -n 1 "$log_dir/server.pid" 2>/dev/null || true)"
if [ -z "$pid" ]; then
  echo "spmd_serve_entrypoint: no pid file in $log_dir after start_server" >&2
  exit 1
fi

stopping=0
# shellcheck disable=SC2329  # called by the trap below
on_signal() {
  stopping=1
  stop_server "$stop_timeout"
}
trap on_signal TERM INT

tail -n 0 -F "$log_dir/server.log" &
tail_pid=$!

while kill -0 "$pid" 2>/dev/null; do
  sleep 2 &
  wait $! || true
done

kill "$tail_pid" 2>/dev/null || true
if [ "$stopping" = 1 ]; then
  exit 0
fi
echo "spmd_serve_entrypoint: the server (mpirun pid $pid) ended; see $log_dir/server.log" >&2
stop_server 0 >/dev/null 2>&1 || true   # removes the pid file and anything left behind
exit 1
