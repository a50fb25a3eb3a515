#!/bin/bash
# Compile the Seldon Core protocol (abeja_runtime/styles/seldon/protos/*.proto) into the
# descriptor set the runtime loads (seldon.desc). Needs grpcio-tools (the test extra);
# tests/test_styles_seldon_grpc.py fails when seldon.desc does not match the .proto files.
set -euo pipefail
cd "$(dirname "$0")/../abeja_runtime/styles/seldon/protos"
google=$(python -c "import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), '_proto'))")
python -m grpc_tools.protoc -I. -I"$google" --include_imports --descriptor_set_out=seldon.desc prediction.proto
