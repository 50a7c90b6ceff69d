#!/usr/bin/env bash
# The linters CI runs before the tests: ruff (lint + import order + format check), mypy
# (configured in setup.cfg; strict on the scheduler, the engine, the step and manifest contracts and
# the front end's parsers) and shellcheck on the tracked shell scripts (tests/e2e/test_docker_files.py
# checks them too, late in the run).  `launch/lint.sh --fix` applies ruff's fixes and formatting instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
paths=(spmd_serve ops tests benchmarks)
if [ "${1:-}" = "--fix" ]; then
  "$bin/ruff" check --fix "${paths[@]}"
  "$bin/ruff" format "${paths[@]}"
  exit 0
fi
"$bin/ruff" check "${paths[@]}"
"$bin/ruff" format --check "${paths[@]}"
"$bin/mypy" spmd_serve ops
mapfile -t scripts < <(git ls-files '*.sh' .ci/run)
"$bin/shellcheck" "${scripts[@]}"
