#!/usr/bin/env bash
# Build the bundle shipped to the GPU machine (which has no Rust and no network), on the dev
# machine, from the repo root:
#
#   scripts/bundle.sh [--with-flashinfer] [--flashinfer-jit FILE.tar.gz] [--strip] [--no-wheel]
#
# Produces (git-ignored):
#   .bundle/bin/tessera      release build of the CLI (cargo build --release -p tessera-cli)
#   .bundle/baselines/*.py   the Python baseline runners (copy of scripts/baselines/)
#   .bundle/cache.tar.xz     every kernel variant pre-compiled for sm_90a (the JIT cache, packed;
#                            device-run.sh unpacks it to .bundle/cache)
#   .bundle/COMMIT           git commit of the build (+ "-dirty" when the tree had changes);
#                            device-run.sh exports it as TESSERA_COMMIT
#   .bundle/wheels/tessera-*.whl  the Python package (scripts/build-wheel.sh: abi3, CPython >= 3.9,
#                            ~0.5 MB); not with --no-wheel. device-run.sh installs every
#                            .bundle/wheels/*.whl (below) and, asked for the op `python`, runs the
#                            package's tests (crates/tessera-py/tests) and
#                            scripts/baselines/bench_python.py
#   .bundle/pytest-wheels/   pytest and its pure-Python dependencies for CPython 3.12 (~0.5 MB),
#                            installed there only when that Python has no pytest
#   .bundle/wheels/*.whl     only with --with-flashinfer: the wheels of FlashInfer 0.6.12 and
#                            its two small dependencies for CPython 3.12 / x86_64 (~18 MB;
#                            unpacked they are ~120 MB, too big to ship). device-run.sh
#                            installs them there with pip --no-deps --no-index --target into a
#                            temporary folder and puts that on PYTHONPATH
#   .bundle/flashinfer-aot/  only with --flashinfer-jit FILE (implies --with-flashinfer): the
#                            FlashInfer modules an earlier device run compiled (its
#                            OUTDIR/flashinfer-jit.tar.gz, <uri>/<uri>.so, ~2.8 MB each);
#                            device-run.sh installs them as FlashInfer's AOT modules so that
#                            run skips nvcc (~70 s for fa3, ~20 s for fa2 per configuration).
#                            Valid only for the same FlashInfer version and GPU arch (sm_90a)
# --strip removes the debug info from the binary (~40 -> ~5 MiB; no line numbers in backtraces);
# it is also done automatically when the total would exceed the limit.
#
# TESSERA_BUNDLE_OPS="attention" pre-compiles only those operators' kernels (the cache of every
# operator can exceed the size limit); default: every operator.
#
# The repo tree plus .bundle/ must stay under 60 MiB: the total is printed and checked.
# On the GPU machine: scripts/device-run.sh "$OUT" softmax
set -euo pipefail

FLASHINFER_WHEELS=(flashinfer-python==0.6.12 apache-tvm-ffi==0.1.15.post2 cuda-tile==1.7.0)
LIMIT_MIB=60

die() {
    echo "bundle: error: $*" >&2
    exit 1
}

with_flashinfer=0
flashinfer_jit=""
strip=0
wheel=1
PYTEST_WHEELS=(pytest==8.3.5)
for arg in "$@"; do
    case "$arg" in
    --with-flashinfer) with_flashinfer=1 ;;
    --no-wheel) wheel=0 ;;
    --strip) strip=1 ;;
    -h | --help)
        awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    --flashinfer-jit) want_jit=1 ;;
    *)
        if [[ ${want_jit:-0} == 1 ]]; then
            flashinfer_jit="$(realpath "$arg")" || die "--flashinfer-jit: $arg not found"
            with_flashinfer=1
            want_jit=0
        else
            die "unknown argument '$arg' (usage: $0 [--with-flashinfer] [--flashinfer-jit FILE.tar.gz] [--strip] [--no-wheel])"
        fi
        ;;
    esac
done
[[ ${want_jit:-0} == 0 ]] || die "--flashinfer-jit needs a file (a device run's flashinfer-jit.tar.gz)"

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
B="$ROOT/.bundle"

echo "bundle: cargo build --release -p tessera-cli" >&2
cargo build --release -p tessera-cli
target_dir="$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')"
bin="$target_dir/release/tessera"
[[ -x "$bin" ]] || die "$bin not found after the build"

rm -rf "${B:?}/bin" "${B:?}/baselines"
mkdir -p "$B/bin" "$B/baselines"
cp "$bin" "$B/bin/tessera"
if [[ $strip == 1 ]]; then
    strip --strip-debug "$B/bin/tessera" || die "strip failed"
fi
for f in scripts/baselines/*.py; do
    [[ "$(basename "$f")" == test_* ]] || cp "$f" "$B/baselines/"
done

commit="$(git rev-parse --verify -q HEAD 2>/dev/null)" || commit=unknown
if [[ "$commit" != unknown ]] && [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    commit="$commit-dirty"
fi
echo "$commit" >"$B/COMMIT"

# Pre-compile every kernel variant for Hopper (sm_90a) into the bundle's kernel cache, so the
# GPU machine spends its time running kernels, not compiling them (device-run.sh points
# TESSERA_CACHE_DIR at it; the cache key includes the NVRTC version, so a different NVRTC there
# simply recompiles).
rm -rf "${B:?}/cache" # entries of older kernel sources would only take space
if eval "$(bash scripts/setup-cuda-tools.sh)"; then
    export TESSERA_NVRTC
    # shellcheck disable=SC2086 # TESSERA_BUNDLE_OPS is a word list on purpose
    TESSERA_CACHE_DIR="$B/cache" "$B/bin/tessera" compile ${TESSERA_BUNDLE_OPS:-} --arch sm_90a ||
        echo "bundle: warning: some kernels failed to compile or spilled (see above)" >&2
else
    echo "bundle: NVRTC setup failed: kernels will be compiled on the GPU machine" >&2
fi
# cubins compress ~10x: the cache travels as cache.tar.xz, unpacked by device-run.sh
rm -f "$B/cache.tar.xz"
if [[ -d "$B/cache" ]]; then
    tar -C "$B" -cJf "$B/cache.tar.xz" cache || die "cannot pack the kernel cache"
    rm -rf "${B:?}/cache"
fi

rm -rf "${B:?}/wheels" "${B:?}/pytest-wheels"
if [[ $wheel == 1 ]]; then
    bash scripts/build-wheel.sh "$B/wheels" >/dev/null || die "the tessera wheel did not build (--no-wheel skips it)"
    echo "bundle: pytest wheels for CPython 3.12: ${PYTEST_WHEELS[*]}" >&2
    target/python/tools/bin/pip download -d "$B/pytest-wheels" --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 --abi none --platform any \
        --disable-pip-version-check --no-input -q "${PYTEST_WHEELS[@]}" ||
        die "pip download of ${PYTEST_WHEELS[*]} failed"
fi
if [[ $with_flashinfer == 1 ]]; then
    echo "bundle: FlashInfer wheels for CPython 3.12 x86_64: ${FLASHINFER_WHEELS[*]}" >&2
    python3 -m pip download --no-deps -d "$B/wheels" --only-binary=:all: \
        --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
        --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any \
        --disable-pip-version-check --no-input -q \
        "${FLASHINFER_WHEELS[@]}" || die "pip download of the FlashInfer wheels failed"
fi

rm -rf "${B:?}/flashinfer-aot"
if [[ -n "$flashinfer_jit" ]]; then
    # entries must be <uri>/<uri>.so (what device-run.sh packs)
    tar -tzf "$flashinfer_jit" | grep -v '/$' | sed 's|^\./||' |
        awk -F/ 'NF != 2 || $2 != $1 ".so" {bad = 1; print "bundle: unexpected entry " $0 > "/dev/stderr"} END {exit bad}' ||
        die "$flashinfer_jit is not a device run's flashinfer-jit.tar.gz"
    mkdir -p "$B/flashinfer-aot"
    tar -xzf "$flashinfer_jit" -C "$B/flashinfer-aot" || die "cannot unpack $flashinfer_jit"
    echo "bundle: FlashInfer modules from $flashinfer_jit: $(ls "$B/flashinfer-aot" | wc -l)" >&2
fi

# size check: files that travel (tracked + untracked-not-ignored) plus the bundle
repo_bytes="$(git ls-files -z --cached --others --exclude-standard 2>/dev/null |
    xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}' || true)"
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
limit=$((LIMIT_MIB * 1024 * 1024))
total=$((repo_bytes + $(du -sb "$B" | cut -f1)))
if ((total >= limit)) && [[ $strip == 0 ]]; then
    echo "bundle: $(mib "$total") is over $LIMIT_MIB MiB: stripping the debug info from bin/tessera" >&2
    strip --strip-debug "$B/bin/tessera" || die "strip failed"
fi
bundle_bytes="$(du -sb "$B" | cut -f1)"
total=$((repo_bytes + bundle_bytes))
echo "bundle: .bundle $(mib "$bundle_bytes") (tessera $(mib "$(stat -c %s "$B/bin/tessera")")), repo tree $(mib "$repo_bytes"), total $(mib "$total") of $LIMIT_MIB MiB; commit $commit"
du -sh "$B"/* >&2
if ((total >= limit)); then
    die "repo tree + .bundle is $(mib "$total"), over the $LIMIT_MIB MiB limit"
fi
