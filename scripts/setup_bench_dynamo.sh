#!/usr/bin/env bash
# The bench-only venv for `python -m bench autoscale`'s `dynamo` policy: NVIDIA Dynamo's
# planner (PyPI `ai-dynamo`, a py3-none-any wheel) and what its load predictors import
# (pandas, pmdarima, filterpy, prophet). Never the product's .venv: the bench runs the
# predictors out of process (bench/autoscale_dynamo.py) with .venv-dynamo/bin/python.
#
# Usage: scripts/setup_bench_dynamo.sh   (idempotent; PYTHON=python3.11 to choose)
# What does not install is said at the end and left out; the bench then reports the
# predictors it could not run, and why, instead of running them.
set -uo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
VENV="${DYNAMO_VENV:-.venv-dynamo}"
DYNAMO_VERSION="${DYNAMO_VERSION:-1.6.1}"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV" || exit 1
fi
# git ignores the venv without a line in the project's .gitignore
printf '*\n' >"$VENV/.gitignore"

# `pip install ai-dynamo` fails here: one of its requirements, aisimulate, is a PyPI stub
# that downloads its wheel from NVIDIA's own index. Its other requirements serve
# Dynamo's workers and connectors, not the predictors, whose module imports the
# planner's config (pydantic, pyyaml, msgspec) and the runtime's logging setup
# (ai-dynamo-runtime, a manylinux wheel, with uvloop). So: the two wheels without their
# requirements, then what those imports need.
echo "==> ai-dynamo==$DYNAMO_VERSION and ai-dynamo-runtime==$DYNAMO_VERSION (no requirements)"
"${PIP[@]}" --no-deps "ai-dynamo==$DYNAMO_VERSION" "ai-dynamo-runtime==$DYNAMO_VERSION" || exit 1
"${PIP[@]}" "pydantic>=2.10.6,<=2.13.5" pyyaml numpy msgspec uvloop || exit 1  # the runtime's pin

failed=()
for pkg in pandas filterpy pmdarima prophet; do
  echo "==> $pkg"
  if ! "${PIP[@]}" "$pkg"; then
    failed+=("$pkg")
  fi
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "not installed: ${failed[*]} (the bench reports the predictors that need them as skipped)"
fi
echo '{"predictors": ["constant"], "warm": [1, 2, 3], "series": [4]}' \
  | "$VENV/bin/python" bench/autoscale_dynamo_helper.py 2>/dev/null \
  || echo "the predictors' helper did not run: see bench/results/autoscale.md"
exit 0
