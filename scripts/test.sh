#!/usr/bin/env bash
# The project's test command (what the README and CI run), from a fresh clone, no GPU needed:
#   scripts/test.sh                      cargo test --workspace --release, then the Python tests
#   scripts/test.sh --python [ARGS...]   only the Python tests (scripts/test-python.sh: build the
#                                        wheel, install it in a fresh venv, pytest ARGS)
#   scripts/test.sh ARGS...              cargo test --release ARGS (e.g. -p tessera softmax)
# Installs NVRTC into .cuda-tools/python (scripts/setup-cuda-tools.sh), points TESSERA_NVRTC at
# it and runs the workspace tests in release mode (the CPU references over large inputs are slow
# in debug). With CI=true, TESSERA_REQUIRE_NVRTC=1 makes tests that need NVRTC fail instead of
# skip when it cannot be loaded.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

setup_out="$(bash scripts/setup-cuda-tools.sh)"
eval "$setup_out"
export TESSERA_NVRTC
if [[ "${CI:-}" == "true" ]]; then
    export TESSERA_REQUIRE_NVRTC=1
fi
echo "test.sh: TESSERA_NVRTC=$TESSERA_NVRTC TESSERA_REQUIRE_NVRTC=${TESSERA_REQUIRE_NVRTC:-}" >&2

if [[ $# -eq 0 ]]; then
    cargo test --workspace --release
    exec bash scripts/test-python.sh
fi
if [[ "$1" == "--python" ]]; then
    shift
    exec bash scripts/test-python.sh "$@"
fi
# with arguments (e.g. -p tessera softmax) they select what runs; --workspace would override -p
exec cargo test --release "$@"
