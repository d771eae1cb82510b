#!/usr/bin/env bash
# Builds the `tessera` Python wheel (crates/tessera-py: PyO3, abi3 for CPython >= 3.9, plain
# linux_x86_64 tag) with maturin, installing maturin first into a project-local venv:
#
#   scripts/build-wheel.sh OUTDIR        prints the wheel's path on stdout (messages on stderr)
#
# The tools venv, target/python/tools, holds maturin and pytest at the pinned versions below
# (scripts/test-python.sh uses its pytest version too) and is reused while the pins hold.
# Exit status 3 when the tools cannot be installed (no network, no python3-venv), so callers
# can tell a missing tool from a failed build. Environment: PYTHON (default python3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"

MATURIN_VERSION=1.16.0
PYTEST_VERSION=8.3.5
PYTHON="${PYTHON:-python3}"
TOOLS="$ROOT/target/python/tools"

log() { echo "build-wheel: $*" >&2; }
[[ $# -eq 1 ]] || {
    log "usage: $0 OUTDIR"
    exit 2
}
out="$(mkdir -p "$1" && cd "$1" && pwd)"

stamp="$TOOLS/.pins-$MATURIN_VERSION-$PYTEST_VERSION"
if [[ ! -f "$stamp" ]]; then
    rm -rf "$TOOLS"
    "$PYTHON" -m venv "$TOOLS" || {
        log "'$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)"
        exit 3
    }
    "$TOOLS/bin/pip" install --disable-pip-version-check --no-input -q \
        "maturin==$MATURIN_VERSION" "pytest==$PYTEST_VERSION" || {
        log "pip install maturin==$MATURIN_VERSION pytest==$PYTEST_VERSION failed (no network?)"
        exit 3
    }
    touch "$stamp"
fi

rm -f "$out"/tessera-*.whl
log "maturin build --release (crates/tessera-py) -> $out"
(cd crates/tessera-py && "$TOOLS/bin/maturin" build --release --out "$out" >&2)
wheel="$(ls "$out"/tessera-*-cp39-abi3-linux_x86_64.whl 2>/dev/null | head -n 1)"
[[ -n "$wheel" ]] || {
    log "no cp39-abi3 linux_x86_64 wheel in $out: $(ls "$out" 2>&1)"
    exit 1
}
log "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
echo "$wheel"
