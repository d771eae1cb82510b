#!/usr/bin/env bash
# The Python part of the tests (scripts/test.sh runs it after cargo test; no GPU needed):
#
#   scripts/test-python.sh [PYTEST ARGS...]
#
# 1. installs maturin and pytest (pinned) from PyPI into a project-local tools venv,
#    target/python/tools (kept between runs);
# 2. builds the `tessera` wheel (crates/tessera-py: abi3, CPython >= 3.9, linux_x86_64) into
#    target/python/wheels with `maturin build --release`;
# 3. installs it into a fresh venv (target/python/venv-3.X, made anew every run) with pytest and
#    runs crates/tessera-py/tests: import, signatures, stubs, argument validation and the
#    no-GPU error (test_api.py); test_gpu.py skips itself without torch or a GPU;
# 4. does the same with python3.12 (the GPU machine's version) and python3.9 (the oldest the
#    wheel supports) when those interpreters are on PATH.
#
# Without network or python3-venv the tests are skipped with a warning, except under CI=true,
# where any missing tool is an error. Environment: PYTHON (default python3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"

MATURIN_VERSION=1.16.0
PYTEST_VERSION=8.3.5
PYTHON="${PYTHON:-python3}"
OUT="$ROOT/target/python"
TOOLS="$OUT/tools"
CRATE="$ROOT/crates/tessera-py"

log() { echo "test-python: $*" >&2; }
# A missing tool: fatal under CI, a skip elsewhere.
missing() {
    if [[ "${CI:-}" == "true" ]]; then
        log "error: $*"
        exit 1
    fi
    log "warning: $* -- Python tests skipped"
    exit 0
}
pip_quiet=(--disable-pip-version-check --no-input -q)

command -v "$PYTHON" >/dev/null 2>&1 || missing "$PYTHON not found"
t0=$(date +%s)

# 1. tools venv (maturin, pytest), reused while the pins do not change
stamp="$TOOLS/.pins-$MATURIN_VERSION-$PYTEST_VERSION"
if [[ ! -f "$stamp" ]]; then
    rm -rf "$TOOLS"
    "$PYTHON" -m venv "$TOOLS" || missing "'$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)"
    "$TOOLS/bin/pip" install "${pip_quiet[@]}" "maturin==$MATURIN_VERSION" "pytest==$PYTEST_VERSION" ||
        missing "pip install maturin==$MATURIN_VERSION pytest==$PYTEST_VERSION failed (no network?)"
    touch "$stamp"
fi

# 2. the wheel
rm -rf "$OUT/wheels"
log "maturin build --release (crates/tessera-py)"
(cd "$CRATE" && "$TOOLS/bin/maturin" build --release --out "$OUT/wheels" >&2)
wheel="$(ls "$OUT"/wheels/tessera-*-cp39-abi3-linux_x86_64.whl 2>/dev/null | head -n 1)"
[[ -n "$wheel" ]] || {
    log "error: no cp39-abi3 linux_x86_64 wheel in $OUT/wheels: $(ls "$OUT/wheels" 2>&1)"
    exit 1
}
log "built $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"

# 3./4. a fresh venv per interpreter: install the wheel and pytest, run pytest (ARGS) from a
# folder outside the source tree so that `import tessera` is the installed package
#   run_in PYTHON PYTEST_ARGS...
run_in() {
    local py="$1" ver venv
    ver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    venv="$OUT/venv-$ver"
    rm -rf "$venv"
    "$py" -m venv "$venv" || missing "'$py -m venv' failed"
    "$venv/bin/pip" install "${pip_quiet[@]}" "pytest==$PYTEST_VERSION" || missing "pip install pytest into $venv failed"
    "$venv/bin/pip" install "${pip_quiet[@]}" --no-deps --no-index "$wheel"
    log "pytest with Python $ver ($venv)"
    (cd "$OUT" && "$venv/bin/python" -m pytest -p no:cacheprovider -q "${@:2}")
}

# An interpreter of version $1 (3.12): on PATH, or installed by pyenv but not selected.
find_python() {
    local c
    for c in "python$1" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/"python$1"; do
        if "$c" -c 'import venv' >/dev/null 2>&1; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

run_in "$PYTHON" "$CRATE/tests" "$@"
main_ver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
for ver in 3.12 3.9; do
    [[ "$ver" == "$main_ver" ]] && continue
    if py="$(find_python "$ver")"; then
        run_in "$py" "$CRATE/tests/test_api.py" "$@"
    else
        log "Python $ver not found: the wheel is not tried with it"
    fi
done
log "done in $(($(date +%s) - t0)) s"
