#!/usr/bin/env bash
# The linters CI runs before the tests: ruff (lint + import order + format check) and mypy
# (configured in setup.cfg; strict on the scheduler, the engine, the step and manifest contracts and
# the front end's parsers).  `launch/lint.sh --fix` applies ruff's fixes and formatting instead.
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
