#!/usr/bin/env bash
# Set up, then run every check CI runs: lint, types, layering, and the test suite
# (unit tests, real etcd, real gRPC servers and processes on 127.0.0.1, real vLLM).
# Extra arguments go to pytest, e.g. scripts/test.sh -k failover
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# A real vLLM (CPU build) for the API contract tests: ~3 min the first time, seconds
# after. TECTONIC_NO_VLLM=1 skips it locally (then add -m "not realvllm"); CI never does.
if [ "${TECTONIC_NO_VLLM:-0}" != "1" ] || [ -n "${CI:-}" ]; then
  scripts/setup_vllm_cpu.sh
fi
echo "==> ruff";  .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "==> mypy";  .venv/bin/mypy
echo "==> import layering"; .venv/bin/lint-imports
echo "==> pytest"
exec .venv/bin/pytest -q -p no:cacheprovider --durations=15 "$@"
