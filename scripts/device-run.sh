#!/usr/bin/env bash
# Runs ON the GPU machine, from the repo root, with the bundle made by scripts/bundle.sh:
#
#   scripts/device-run.sh [--no-bench] [--no-sanitizer] [--python] [--no-pytest] OUTDIR [OPS...]
#   e.g.  scripts/device-run.sh "$OUT" softmax
#         scripts/device-run.sh "$OUT" python        (only the Python package's steps)
#
# Steps (all of them always run, whatever fails):
#   1. tessera info                                    -> OUTDIR/log.txt
#   2. tessera verify OP, one process per operator     -> OUTDIR/log.txt
#   3. tessera bench OPS --baselines --json OUTDIR     -> OUTDIR/log.txt, OUTDIR/<op>.json|png
#   4. compute-sanitizer --tool memcheck / racecheck  tessera verify OP --quick (per operator)
#                                                      -> OUTDIR/sanitizer.txt (summary in log)
#   5. with the op `python` (or --python), the Python package of the bundle (.bundle/wheels,
#      installed into a temporary folder on PYTHONPATH with pytest from .bundle/pytest-wheels
#      when this Python has none):
#      python -m pytest crates/tessera-py/tests                      -> OUTDIR/log.txt
#      python .bundle/baselines/bench_python.py --json OUTDIR         -> OUTDIR/python.json
#      (tessera's Python API against torch softmax / SDPA in one process; bench_python.py
#      --flashinfer too when FlashInfer's wheels are in the bundle). --no-bench skips the
#      benchmark, --no-pytest the tests; TESSERA_PYTHON_BENCH_ARGS adds arguments (--quick).
# No OPS means every operator (and not `python`); OPS = `python` alone runs info and step 5
# only. Exit status: 0 when every step passed; 1 when verify, bench, the Python tests or
# benchmark failed or a sanitizer reported errors (the failed steps are listed at the end of
# the log).
# Only log.txt, sanitizer.txt and the bench's JSON/PNG files are written into OUTDIR (the
# device tool returns at most 8 files), so ask for at most 3 operators per run; with room left,
# flashinfer-jit.tar.gz holds the FlashInfer modules the run compiled (for bundle.sh
# --flashinfer-jit, so the next run loads them instead of compiling).
#
# Environment: TESSERA_BIN (default .bundle/bin/tessera), TESSERA_STEP_TIMEOUT (seconds per
# step, 0 = none; a hung step is then killed and counted as failed), TESSERA_BENCH_ROUNDS
# (`bench --rounds N`: N passes of ours and the baselines, each row the median pass), PYTHON
# (default python3), FLASHINFER_WORKSPACE_BASE (FlashInfer's JIT cache; default
# .bundle/flashinfer-jit), and bench_attention.py's TESSERA_BASELINE_IMPLS, TESSERA_FLASHINFER_ALL=1 (FlashInfer on every
# attention case, not only the seed table's), TESSERA_FLASHINFER_MAX_JIT (default 4).
set -uo pipefail
export PYTHONUNBUFFERED=1

usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'; }

bench=1
sanitizer=1
python=0
pytest=1
while [[ $# -gt 0 ]]; do
    case "$1" in
    --no-bench) bench=0 ;;
    --no-sanitizer) sanitizer=0 ;;
    --python) python=1 ;;
    --no-pytest) pytest=0 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "device-run: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) break ;;
    esac
    shift
done
if [[ $# -lt 1 ]]; then
    usage >&2
    exit 2
fi
OUTDIR="$1"
shift
OPS=()
for op in "$@"; do
    if [[ "$op" == python ]]; then python=1; else OPS+=("$op"); fi
done
# `python` alone: no operator steps of the CLI
cli_ops=1
if [[ $python == 1 && ${#OPS[@]} -eq 0 && $# -gt 0 ]]; then cli_ops=0; fi

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
mkdir -p "$OUTDIR" || exit 2
OUTDIR="$(cd "$OUTDIR" && pwd)"
LOG="$OUTDIR/log.txt"
SAN="$OUTDIR/sanitizer.txt"
: >"$LOG"

BIN="${TESSERA_BIN:-.bundle/bin/tessera}"
STEP_TIMEOUT="${TESSERA_STEP_TIMEOUT:-0}"
failed=()

say() { echo "$*" | tee -a "$LOG"; }

# run_step NAME FILE CMD...: runs CMD, output (stdout+stderr) appended to FILE and shown; returns
# CMD's exit status
run_step() {
    local name="$1" file="$2"
    shift 2
    local t0 rc
    t0=$(date +%s)
    say ""
    say "=== [$name] $*"
    if [[ "$file" != "$LOG" ]]; then echo "=== [$name] $*" >>"$file"; fi
    if [[ "$STEP_TIMEOUT" != 0 ]]; then
        timeout --kill-after=10 "$STEP_TIMEOUT" "$@" 2>&1 | tee -a "$file"
    else
        "$@" 2>&1 | tee -a "$file"
    fi
    rc=${PIPESTATUS[0]}
    say "=== [$name] exit $rc after $(($(date +%s) - t0)) s"
    return "$rc"
}

say "device-run: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
if [[ $cli_ops == 1 ]]; then ops_text="${OPS[*]:-(all)}"; else ops_text="(none)"; fi
[[ $python == 1 ]] && ops_text="$ops_text + python"
say "device-run: ops: $ops_text  bin: $BIN  out: $OUTDIR"

if [[ -f .bundle/COMMIT ]]; then
    TESSERA_COMMIT="$(cat .bundle/COMMIT)"
    export TESSERA_COMMIT
    say "device-run: commit $TESSERA_COMMIT"
fi
# Python wheels shipped in the bundle (FlashInfer: scripts/bundle.sh --with-flashinfer),
# installed offline into a temporary folder put on PYTHONPATH
FI_CACHE=""
if compgen -G ".bundle/wheels/*.whl" >/dev/null; then
    PYDIR="${TMPDIR:-/tmp}/tessera-bundle-python"
    rm -rf "$PYDIR"
    wheels=(.bundle/wheels/*.whl)
    if [[ $python == 1 ]] && ! "${PYTHON:-python3}" -c 'import pytest' 2>/dev/null &&
        compgen -G ".bundle/pytest-wheels/*.whl" >/dev/null; then
        wheels+=(.bundle/pytest-wheels/*.whl)
    fi
    if run_step wheels "$LOG" "${PYTHON:-python3}" -m pip install --no-deps --no-index \
        --disable-pip-version-check --no-input -q --target "$PYDIR" "${wheels[@]}"; then
        export PYTHONPATH="$PYDIR${PYTHONPATH:+:$PYTHONPATH}"
        # FlashInfer JIT-compiles each kernel configuration with nvcc on first use (~70 s for
        # fa3, ~16-21 s for fa2) into $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer/<version>/
        # <arch>/cached_ops/<uri>/<uri>.so. Modules built by an earlier run (bundle.sh
        # --flashinfer-jit) go where FlashInfer looks for AOT modules, <package>/data/aot/<uri>/
        # <uri>.so, and load without compiling (same FlashInfer version and GPU arch only).
        export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$PWD/.bundle/flashinfer-jit}"
        FI_CACHE="$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer"
        if compgen -G ".bundle/flashinfer-aot/*/*.so" >/dev/null && [[ -d "$PYDIR/flashinfer" ]]; then
            mkdir -p "$PYDIR/flashinfer/data/aot"
            cp -r .bundle/flashinfer-aot/* "$PYDIR/flashinfer/data/aot/"
            say "device-run: FlashInfer modules built earlier: $(ls .bundle/flashinfer-aot | wc -l) (.bundle/flashinfer-aot)"
        fi
    else
        say "device-run: installing .bundle/wheels failed: those baselines will be missing"
    fi
fi
if [[ -f .bundle/cache.tar.xz ]]; then
    # bundle.sh packs the kernel cache (python's tarfile: no xz binary needed)
    rm -rf .bundle/cache
    "${PYTHON:-python3}" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        .bundle/cache.tar.xz .bundle || echo "device-run: cannot unpack .bundle/cache.tar.xz" >&2
fi
if [[ -d .bundle/cache ]]; then
    export TESSERA_CACHE_DIR="$PWD/.bundle/cache" # kernels pre-compiled by bundle.sh
fi
if [[ -d .bundle/baselines ]]; then
    export TESSERA_BASELINES_DIR="$PWD/.bundle/baselines"
fi

# NCCL for the distributed LSMR cases (`verify lsmr`: a communicator of size 1): cudarc opens NCCL
# only as libnccl.so (or .so.13, ...), never as libnccl.so.2, the one library of PyTorch's
# nvidia-nccl-cu13 wheel, so link that file as libnccl.so in a folder on LD_LIBRARY_PATH.
# Without it those cases are skipped (their note says why), nothing fails.
nccl_lib="$("${PYTHON:-python3}" -c 'import glob, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
found = [p for d in dirs for p in glob.glob(d + "/nvidia/nccl/lib/libnccl.so.2")]
print(found[0] if found else "")' 2>/dev/null || true)"
if [[ -n "$nccl_lib" ]]; then
    NCCL_LINK_DIR="${TMPDIR:-/tmp}/tessera-nccl-link"
    if mkdir -p "$NCCL_LINK_DIR" && ln -sf "$nccl_lib" "$NCCL_LINK_DIR/libnccl.so"; then
        export LD_LIBRARY_PATH="$NCCL_LINK_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        say "device-run: NCCL $nccl_lib linked as $NCCL_LINK_DIR/libnccl.so"
    fi
else
    say "device-run: no nvidia/nccl/lib/libnccl.so.2 in python's site-packages: the distributed cases will be skipped"
fi

# environment facts (never fatal)
if command -v nvidia-smi >/dev/null 2>&1; then
    run_step env "$LOG" nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit --format=csv
fi
run_step env "$LOG" "${PYTHON:-python3}" -c 'import sys; print("python", sys.version.split()[0])
try:
    import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)
except Exception as e:
    print("torch: not importable:", e)' || true

if [[ ! -x "$BIN" ]]; then
    say "device-run: ERROR: $BIN not found or not executable (run scripts/bundle.sh on the dev machine)"
    exit 1
fi

run_step info "$LOG" "$BIN" info || failed+=("info")
if [[ $cli_ops == 1 ]]; then
    # one process per operator: a kernel fault (a sticky CUDA error) in one cannot fail the
    # others' cases
    for op in "${OPS[@]}"; do
        run_step "verify $op" "$LOG" "$BIN" verify "$op" || failed+=("verify-$op")
    done
    if [[ $bench == 1 ]]; then
        run_step bench "$LOG" "$BIN" bench "${OPS[@]}" --baselines --json "$OUTDIR" \
            ${TESSERA_BENCH_ROUNDS:+--rounds "$TESSERA_BENCH_ROUNDS"} || failed+=("bench")
    fi
fi

# the Python package: its tests (GPU and API) and the side-by-side benchmark
if [[ $python == 1 ]]; then
    if "${PYTHON:-python3}" -c 'import tessera' 2>/dev/null; then
        if [[ $pytest == 1 ]]; then
            run_step python-tests "$LOG" "${PYTHON:-python3}" -m pytest -q -p no:cacheprovider -rfEs \
                crates/tessera-py/tests || failed+=("python-tests")
        fi
        if [[ $bench == 1 ]]; then
            bench_args=()
            "${PYTHON:-python3}" -c 'import flashinfer' 2>/dev/null && bench_args=(--flashinfer)
            # shellcheck disable=SC2206 # a word list on purpose
            bench_args+=(${TESSERA_PYTHON_BENCH_ARGS:-})
            run_step python-bench "$LOG" "${PYTHON:-python3}" .bundle/baselines/bench_python.py \
                --json "$OUTDIR" "${bench_args[@]}" || failed+=("python-bench")
        fi
    else
        say "device-run: ERROR: the tessera Python package is not importable (scripts/bundle.sh builds .bundle/wheels/tessera-*.whl)"
        failed+=("python")
    fi
fi

find_sanitizer() {
    local c
    for c in "$(command -v compute-sanitizer 2>/dev/null)" \
        "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
        "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
        if [[ -n "$c" && -x "$c" ]]; then
            echo "$c"
            return 0
        fi
    done
    return 1
}

if [[ $sanitizer == 1 && $cli_ops == 1 ]]; then
    : >"$SAN"
    if CS="$(find_sanitizer)"; then
        for tool in memcheck racecheck; do
            # --error-exitcode makes any reported error visible in the exit status even when
            # verify itself passes
            before=$(wc -l <"$SAN")
            rc=0
            for op in "${OPS[@]}"; do
                run_step "sanitizer-$tool $op" "$SAN" "$CS" --tool "$tool" --error-exitcode 86 \
                    "$BIN" verify "$op" --quick >/dev/null || rc=$?
            done
            if tail -n +$((before + 1)) "$SAN" |
                grep -Eq 'ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: .*\([1-9][0-9]* error'; then
                rc=86
            fi
            if [[ $rc == 0 ]]; then
                say "=== [sanitizer-$tool] clean"
            else
                say "=== [sanitizer-$tool] FAILED (exit $rc): see sanitizer.txt"
                failed+=("sanitizer-$tool")
            fi
        done
        # the summaries also go into the main log
        say ""
        say "=== sanitizer summaries (full output in sanitizer.txt)"
        grep -E "^=== |ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY" "$SAN" | tee -a "$LOG"
    else
        say "device-run: compute-sanitizer not found (PATH, \$CUDA_HOME, /usr/local/cuda): sanitizer steps skipped"
        echo "compute-sanitizer not found: skipped" >>"$SAN"
    fi
fi

# FlashInfer modules this run compiled, for the next bundle (bundle.sh --flashinfer-jit FILE):
# OUTDIR/flashinfer-jit.tar.gz holds <uri>/<uri>.so (~2.8 MB each, ~45% smaller packed); only
# written when it stays under 15 MiB and OUTDIR holds fewer than 8 files (the device tool's limit)
if [[ -n "$FI_CACHE" && -d "$FI_CACHE" ]]; then
    stage="${TMPDIR:-/tmp}/tessera-flashinfer-jit"
    rm -rf "$stage" && mkdir -p "$stage"
    while IFS= read -r so; do
        uri="$(basename "$so" .so)"
        [[ -e ".bundle/flashinfer-aot/$uri/$uri.so" ]] && continue # shipped, not built here
        mkdir -p "$stage/$uri" && cp "$so" "$stage/$uri/"
    done < <(find "$FI_CACHE" -path '*/cached_ops/*/*.so' 2>/dev/null)
    if [[ -n "$(ls -A "$stage")" ]]; then
        tar -czf "$stage.tar.gz" -C "$stage" . &&
            if (($(stat -c %s "$stage.tar.gz") < 15 * 1024 * 1024)) &&
                (($(find "$OUTDIR" -type f | wc -l) < 8)); then
                cp "$stage.tar.gz" "$OUTDIR/flashinfer-jit.tar.gz"
                say "device-run: FlashInfer modules built in this run: $(ls "$stage" | tr '\n' ' ')-> flashinfer-jit.tar.gz"
            else
                say "device-run: FlashInfer modules built ($(du -sh "$stage.tar.gz" | cut -f1) packed) not returned: too big or too many files in $OUTDIR"
            fi
    fi
fi

# the device tool returns files up to 16 MiB: keep head and tail of anything larger
cap_file() {
    local f="$1" max=$((15 * 1024 * 1024))
    if [[ -f "$f" && $(stat -c %s "$f") -gt $max ]]; then
        { head -c $((max / 2)) "$f"; printf '\n\n[... %s truncated by device-run ...]\n\n' "$(basename "$f")"; tail -c $((max / 2 - 4096)) "$f"; } >"$f.tmp" && mv "$f.tmp" "$f"
    fi
}

say ""
if [[ ${#failed[@]} -eq 0 ]]; then
    say "device-run: ALL STEPS PASSED"
    status=0
else
    say "device-run: FAILED: ${failed[*]}"
    status=1
fi
say "device-run: files in $OUTDIR: $(find "$OUTDIR" -mindepth 1 -printf '%P ')"
cap_file "$SAN"
cap_file "$LOG"
exit "$status"
