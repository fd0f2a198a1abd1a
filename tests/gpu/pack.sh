#!/usr/bin/env bash
# tests/gpu/pack.sh - prepares the GPU check for a lent device machine
# (tests/gpu/README.md): run HERE, on the development machine, not there.
#
# The device machines of this workplace are described as having nvcc,
# CMake, ninja and meson, not the project's C libraries (libzmq, msgpack-c,
# cJSON, Check, libmicrohttpd, libcurl), and nothing can be fetched there;
# and a call carries at most 64 MiB, while the default model alone is
# 94 MiB. So this
# script builds the four programs the check runs (test_backend_ops,
# rlai-gpucheck, bench_spec and the CUDA module, x86-64, CUDA runtime
# linked statically) here and puts them, with the shared libraries they
# need beyond the C and C++ runtimes, in .gpu-carry/bin (a few MiB); and it
# splits the model into two halves, .gpu-carry/model.part00 and .part01,
# with its SHA-256, one half per device call.
#
#   tests/gpu/pack.sh     build dir: $RLAI_GPU_BUILD, default build-gpu
#                         (configured with -Dcuda=enabled when missing);
#                         output: $RLAI_GPU_CARRY, default .gpu-carry;
#                         RLAI_GPU_NO_BUILD=1: take the programs as built
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${RLAI_GPU_BUILD:-build-gpu}
MODEL=${RLAI_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
CARRY=${RLAI_GPU_CARRY:-.gpu-carry}

[ -f "$MODEL" ] || { echo "pack.sh: model $MODEL not found (scripts/setup.sh fetches it)" >&2; exit 1; }
progs="tests/test_backend_ops tests/rlai-gpucheck bench/bench_spec"
if [ "${RLAI_GPU_NO_BUILD:-0}" != 1 ]; then
    if [ ! -f "$BUILD/build.ninja" ]; then
        meson setup "$BUILD" --buildtype=release -Dcuda=enabled >/dev/null
    fi
    grep -q rlai-backend-cuda "$BUILD/build.ninja" ||
        { echo "pack.sh: $BUILD has no CUDA module (configure it with -Dcuda=enabled; nvcc needed)" >&2; exit 1; }
    ninja -C "$BUILD" $progs engine/backend-cuda/rlai-backend-cuda.so >/dev/null
fi

rm -rf "$CARRY"
mkdir -p "$CARRY/bin"
for p in $progs engine/backend-cuda/rlai-backend-cuda.so; do
    cp "$BUILD/$p" "$CARRY/bin/"
done
# Shared libraries beyond the C/C++ runtimes and the dynamic loader, which
# every Linux image has (the device's glibc is newer than this machine's).
for f in "$CARRY"/bin/*; do
    ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r name path; do
    case "$name" in
    libc.so.*|libm.so.*|libdl.so.*|librt.so.*|libpthread.so.*|libstdc++.so.*|libgcc_s.so.*|ld-linux*) ;;
    *) cp -L "$path" "$CARRY/bin/$name" ;;
    esac
done

split -n 2 -d "$MODEL" "$CARRY/model.part"
sha256sum < "$MODEL" | cut -d' ' -f1 > "$CARRY/model.sha256"
echo "$(basename "$MODEL")" > "$CARRY/model.name"

echo "pack.sh: $CARRY ready:"
ls -l "$CARRY" "$CARRY/bin" | sed 's/^/  /'
cat <<'EOF'
Device calls (tests/gpu/README.md), the second right after the first (a
machine stays warm 30 s; if it went back, start again with the first):
  1. carry [".gpu-carry/bin", ".gpu-carry/model.part00", ".gpu-carry/model.sha256", ".gpu-carry/model.name"]
     command: tests/gpu/run.sh --prebuilt .gpu-carry/bin --stage 1
  2. carry [".gpu-carry/bin", ".gpu-carry/model.part01"]
     command: tests/gpu/run.sh --prebuilt .gpu-carry/bin --stage 2
The figures come back in $OUT (gpu-results.md); add them to bench/RESULTS.md here.
EOF
