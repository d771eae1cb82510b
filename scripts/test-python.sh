#!/usr/bin/env bash
# The Python part of the tests (scripts/test.sh runs it after cargo test; no GPU needed):
#
#   scripts/test-python.sh [PYTEST ARGS...]
#
# 1. installs maturin and pytest (pinned) from PyPI into a project-local tools venv,
#    target/python/tools (kept between runs), and
# 2. builds the `tessera` wheel (crates/tessera-py: abi3, CPython >= 3.9, linux_x86_64) into
#    target/python/wheels with `maturin build --release` (both: scripts/build-wheel.sh);
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

PYTHON="${PYTHON:-python3}"
OUT="$ROOT/target/python"
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
export PYTHON

command -v "$PYTHON" >/dev/null 2>&1 || missing "$PYTHON not found"
t0=$(date +%s)

# 1./2. the wheel (and the tools venv with maturin and pytest)
rc=0
wheel="$(bash scripts/build-wheel.sh "$OUT/wheels")" || rc=$?
if [[ $rc == 3 ]]; then
    missing "maturin could not be installed (see above)"
elif [[ $rc != 0 ]]; then
    log "error: the wheel did not build"
    exit "$rc"
fi
PYTEST_VERSION="$(sed -n 's/^PYTEST_VERSION=//p' scripts/build-wheel.sh)"

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

# the extension crate has no Rust test target (it links no libpython): the std-only plan cache
# (crates/tessera-py/src/plan_cache.rs) runs its unit tests on its own
log "plan cache unit tests (rustc --test crates/tessera-py/src/plan_cache.rs)"
mkdir -p "$OUT"
rustc --edition 2021 --test "$CRATE/src/plan_cache.rs" -o "$OUT/plan_cache_test"
"$OUT/plan_cache_test" -q

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
