#!/usr/bin/env bash
# Install the CUDA tools tessera needs on a machine without the CUDA toolkit, into the
# project-local folder .cuda-tools/python (git-ignored), from PyPI wheels:
#
#   nvidia-cuda-nvrtc      libnvrtc.so.13 (+ builtins): all the library needs at run time
#   --dev adds:
#   nvidia-cuda-nvcc       ptxas (register / spill report: ptxas -v on NVRTC's PTX)
#   nvidia-cuda-cuobjdump  cuobjdump -res-usage on CUBINs
#
# Usage:
#   scripts/setup-cuda-tools.sh [--dev]
#   eval "$(scripts/setup-cuda-tools.sh)"     # the export lines go to stdout, messages to stderr
#
# Idempotent: when the pinned versions are already there nothing is downloaded. Reinstalls go
# through a staging folder that is swapped in whole (pip --target does not merge packages that
# share the nvidia/ namespace folder across separate invocations).
# Environment: PYTHON (default python3).
set -euo pipefail

NVRTC_VERSION=13.0.88
NVCC_VERSION=13.0.88
# PyPI has no 13.0.x nvidia-cuda-cuobjdump wheel; 13.2.51 is the oldest published one and it
# reads CUBINs produced by NVRTC 13.0 for sm_80..sm_90a.
CUOBJDUMP_VERSION=13.2.51

die() {
    echo "setup-cuda-tools: error: $*" >&2
    exit 1
}
log() { echo "setup-cuda-tools: $*" >&2; }

dev=0
for arg in "$@"; do
    case "$arg" in
    --dev) dev=1 ;;
    -h | --help)
        sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown argument '$arg' (usage: $0 [--dev])" ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.cuda-tools"
DEST="$TOOLS/python"
PYTHON="${PYTHON:-python3}"
LIBDIR="$DEST/nvidia/cu13/lib"
BINDIR="$DEST/nvidia/cu13/bin"
NVRTC_LIB="$LIBDIR/libnvrtc.so.13"

# name==version pairs wanted in this run
wanted=("nvidia-cuda-nvrtc==$NVRTC_VERSION")
dev_pkgs=("nvidia-cuda-nvcc==$NVCC_VERSION" "nvidia-cuda-cuobjdump==$CUOBJDUMP_VERSION")

# dist-info folder pip writes for name==version
dist_info() {
    local name="${1%%==*}" version="${1##*==}"
    echo "$DEST/${name//-/_}-${version}.dist-info"
}
installed() { [[ -d "$(dist_info "$1")" ]]; }

for p in "${dev_pkgs[@]}"; do
    # keep dev tools installed earlier when a reinstall happens without --dev
    if [[ $dev == 1 ]] || installed "$p"; then wanted+=("$p"); fi
done

mkdir -p "$TOOLS"
# serialise concurrent runs (several test runs starting at once)
if command -v flock >/dev/null 2>&1; then
    exec 9>"$TOOLS/.lock"
    flock 9
fi

missing=()
for p in "${wanted[@]}"; do
    installed "$p" || missing+=("$p")
done
[[ -f "$NVRTC_LIB" ]] || [[ ${#missing[@]} -gt 0 ]] || missing+=("nvidia-cuda-nvrtc==$NVRTC_VERSION")

if [[ ${#missing[@]} -eq 0 ]]; then
    log "up to date in $DEST (${wanted[*]})"
else
    log "installing ${wanted[*]} into $DEST (missing: ${missing[*]})"
    "$PYTHON" -m pip --version >/dev/null 2>&1 ||
        die "'$PYTHON -m pip' is not available (on Debian: apt-get install python3-pip)"
    stage="$TOOLS/python.staging.$$"
    rm -rf "$stage"
    trap 'rm -rf "$stage"' EXIT
    # --target skips PEP 668's externally-managed check, so this works on Debian's python3 too
    "$PYTHON" -m pip install --no-deps --target "$stage" --disable-pip-version-check \
        --no-input --no-warn-script-location --root-user-action=ignore -q "${wanted[@]}" ||
        die "pip install failed for: ${wanted[*]}"
    [[ -f "$stage/nvidia/cu13/lib/libnvrtc.so.13" ]] ||
        die "pip succeeded but $stage/nvidia/cu13/lib/libnvrtc.so.13 is missing"
    old="$TOOLS/python.old.$$"
    if [[ -e "$DEST" ]]; then mv "$DEST" "$old"; fi
    mv "$stage" "$DEST"
    rm -rf "$old"
    trap - EXIT
fi

[[ -f "$NVRTC_LIB" ]] || die "$NVRTC_LIB not found after install"
if [[ $dev == 1 ]]; then
    [[ -x "$BINDIR/ptxas" ]] || die "$BINDIR/ptxas not found after install"
    [[ -x "$BINDIR/cuobjdump" ]] || die "$BINDIR/cuobjdump not found after install"
fi

echo "export TESSERA_NVRTC=\"$NVRTC_LIB\""
if [[ -x "$BINDIR/ptxas" || -x "$BINDIR/cuobjdump" ]]; then
    echo "export PATH=\"$BINDIR:\$PATH\""
fi
