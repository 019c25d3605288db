#!/usr/bin/env bash
# Set up (etcd, .venv) and run the demo: a local etcd, three simulated regions, two
# control-plane replicas; a region blackout fails over, the leader is killed, the
# region recovers in graduated steps. Extra arguments go to `python -m chaos.lab.demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m chaos.lab.demo "$@"
