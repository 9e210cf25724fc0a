#!/usr/bin/env bash
# Regenerates the committed Python stubs beside the .proto files.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
find protos/taskgate -name '*_pb2*.py*' -delete
"$PY" -m grpc_tools.protoc -I protos \
  --python_out=protos --pyi_out=protos --grpc_python_out=protos \
  $(find protos/taskgate -name '*.proto' | sort)
# Every directory on the way to a generated module is a regular package.
find protos/taskgate -type d | while read -r d; do [ -f "$d/__init__.py" ] || : > "$d/__init__.py"; done
