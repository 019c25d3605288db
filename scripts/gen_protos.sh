#!/usr/bin/env bash
# Regenerate the Python gRPC stubs from proto/. Run after editing a .proto file;
# tests/test_proto_stubs.py fails while the committed stubs are stale.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m grpc_tools.protoc -Iproto --python_out=proto --grpc_python_out=proto --pyi_out=proto \
  proto/tectonic_api/v1/*.proto
touch proto/tectonic_api/__init__.py proto/tectonic_api/v1/__init__.py
# KEDA's external scaler interface, vendored unchanged (proto/externalscaler/README.md)
"$PY" -m grpc_tools.protoc -Iproto --python_out=proto --grpc_python_out=proto --pyi_out=proto \
  proto/externalscaler/externalscaler.proto
touch proto/externalscaler/__init__.py
