#!/usr/bin/env bash
# tests/gpu/selftest.sh BUILD_ROOT MODEL - the meson test `gpu-scripts`:
# the GPU check's scripts dry-run on the CPU, as a lent device machine will
# run them (tests/gpu/README.md), so that they still work when a GPU comes:
# pack.sh packs BUILD_ROOT's programs and MODEL (the default model: the
# tool's structured-output check needs a model that closes its JSON) into a
# temporary carry folder; run.sh --prebuilt --stage 1 --dry-run keeps the
# first half; stage 2, given only the second half, joins the model (checked
# against the original byte for byte), runs rlai-gpucheck's checks and
# bench_spec on the CPU; both stages leave their results and logs in $OUT.
# Exit 77 (skipped) without a CUDA module in BUILD_ROOT.
set -euo pipefail
[ $# = 2 ] || { echo "usage: tests/gpu/selftest.sh BUILD_ROOT MODEL" >&2; exit 2; }
BUILD=$(cd "$1" && pwd)
MODEL=$2
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f "$BUILD/engine/backend-cuda/rlai-backend-cuda.so" ] || { echo "no CUDA module in $BUILD: skipped"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export RLAI_GPU_BUILD=$BUILD RLAI_GPU_NO_BUILD=1 RLAI_GPU_CARRY=$T/carry RLAI_GPU_STASH=$T/stash OUT=$T/out
mkdir -p "$OUT"
fail() { echo "selftest: $*" >&2; exit 1; }

RLAI_MODEL=$MODEL "$HERE/pack.sh" > "$T/pack.log" || { cat "$T/pack.log"; fail "pack.sh failed"; }
for f in test_backend_ops rlai-gpucheck bench_spec rlai-backend-cuda.so; do
    [ -f "$T/carry/bin/$f" ] || fail "pack.sh left out $f"
done
[ -f "$T/carry/model.part00" ] && [ -f "$T/carry/model.part01" ] || fail "pack.sh did not split the model"

RLAI_MODEL=$T/absent.gguf "$HERE/run.sh" --prebuilt "$T/carry/bin" --stage 1 --dry-run
grep -q "^test_backend_ops: 100%: Checks: [1-9]" "$OUT/gpu-results-stage1.md" || fail "stage 1: no test_backend_ops result"
[ -f "$T/stash/model.part00" ] || fail "stage 1 did not keep the first half"

rm "$T/carry/model.part00"   # stage 2 gets the second half alone, as on the device
RLAI_MODEL=$T/absent.gguf "$HERE/run.sh" --prebuilt "$T/carry/bin" --stage 2 --dry-run
cmp "$T/stash/$(basename "$MODEL")" "$MODEL" || fail "stage 2 joined a different model"
grep -q "^Checks: [1-9][0-9]* passed, 0 failed (rlai-gpucheck exit 0)" "$OUT/gpu-results-stage2.md" ||
    fail "stage 2: rlai-gpucheck did not pass"
grep -q "^per case" "$OUT/gpu-results-stage2.md" || fail "stage 2: no bench_spec table"
for f in test_backend_ops.log gpucheck.log bench_spec.log; do
    [ -s "$OUT/$f" ] || fail "no $f in \$OUT"
done
echo "selftest: pack.sh and both stages of run.sh work"
