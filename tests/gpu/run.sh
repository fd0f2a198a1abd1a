#!/usr/bin/env bash
# tests/gpu/run.sh - the GPU check of the CUDA backend (issue 10) and of
# speculative decoding on it (issue 14), run by hand on a machine with an
# NVIDIA GPU; not part of CI. Under 5 minutes on a 16-core machine:
#   1. release build with CUDA (build-gpu/): the module, test_backend_ops,
#      rlai-gpucheck, bench_spec - or, with --prebuilt DIR, the programs
#      tests/gpu/pack.sh built elsewhere (a lent device machine has no
#      libzmq, cJSON or Check to build against; tests/gpu/README.md);
#   2. test_backend_ops with the module found: every backend op on the GPU
#      against the same references as the CPU backend;
#   3. rlai-gpucheck on the default model: CUDA vs CPU logits at every
#      position of three prompts (relative L2 per position <= 2e-2 in the
#      default mode, <= 1e-3 in precise mode; top-1 agreement where the CPU's
#      top-2 gap >= 0.05), 64 greedy tokens identical (precise mode),
#      speculative decoding on the GPU identical to plain decoding (alone and
#      beside three other sequences; a JSON-schema request with logprobs:
#      tokens and logprobs bit-identical), then prefill tok/s (512 tokens), TTFT
#      (22 tokens), decode tok/s at batch 1 and 8;
#   4. bench_spec on the device (issue 14's cases at batch 1, speculation
#      off and on, greedy output compared; 3 reps);
#   5. prints the tables and appends them to bench/RESULTS.md with the date
#      and the GPU name (nvidia-smi); under the device tool ($OUT set) also
#      to $OUT/gpu-results.md with the logs, since only $OUT comes back.
# CUDA graphs are not implemented yet: the table says so.
#
#   tests/gpu/run.sh [--prebuilt DIR] [--stage 1|2|all] [--dry-run]
#     --prebuilt DIR  the programs and libraries of tests/gpu/pack.sh
#     --stage 1       step 2 only (no model needed); keeps
#                     .gpu-carry/model.part00 in $RLAI_GPU_STASH (/tmp/rlai-gpu)
#     --stage 2       steps 3-5; without the model, joins the kept part00 and
#                     .gpu-carry/model.part01 and checks the SHA-256
#                     ($RLAI_GPU_CARRY: another folder than .gpu-carry)
#     --dry-run       the CPU-only parts (build without CUDA when nvcc is
#                     absent, the tools against the CPU, nothing appended) -
#                     to check the script itself
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
usage() { echo "usage: tests/gpu/run.sh [--prebuilt DIR] [--stage 1|2|all] [--dry-run]" >&2; exit 2; }
die() { echo "run.sh: $*" >&2; exit 1; }
DRY=0
PREBUILT=
STAGE=all
while [ $# -gt 0 ]; do
    case "$1" in
    --dry-run) DRY=1 ;;
    --prebuilt) [ $# -ge 2 ] || usage; PREBUILT=$2; shift ;;
    --stage) [ $# -ge 2 ] || usage; STAGE=$2; shift ;;
    *) usage ;;
    esac
    shift
done
case "$STAGE" in 1 | 2 | all) ;; *) usage ;; esac
BUILD=${RLAI_GPU_BUILD:-build-gpu}
CARRY=${RLAI_GPU_CARRY:-.gpu-carry}   # where pack.sh's model halves arrive
STASH=${RLAI_GPU_STASH:-/tmp/rlai-gpu}
MODEL=${RLAI_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
JOBS=$(nproc 2>/dev/null || echo 4)
LOG=$(mktemp)
SPEC_LOG=$(mktemp)
REPORT=$(mktemp)
trap 'rm -f "$LOG" "$SPEC_LOG" "$REPORT"' EXIT

if [ $DRY = 0 ]; then
    command -v nvidia-smi >/dev/null || die "nvidia-smi not found (no driver?)"
    GPU=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)
    CUDA_OPT=-Dcuda=enabled
else
    GPU="(dry run, no GPU)"
    CUDA_OPT=-Dcuda=auto
fi
echo "== GPU: $GPU"

t0=$(date +%s)
if [ -n "$PREBUILT" ]; then
    BIN=$(cd "$PREBUILT" && pwd)
    T_OPS=$BIN/test_backend_ops
    T_CHECK=$BIN/rlai-gpucheck
    T_SPEC=$BIN/bench_spec
    export RLAI_BACKEND_DIR=$BIN
    export LD_LIBRARY_PATH=$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    for p in "$T_OPS" "$T_CHECK" "$T_SPEC"; do
        [ -x "$p" ] || die "$p missing (tests/gpu/pack.sh puts it there)"
    done
    [ $DRY = 1 ] || [ -f "$BIN/rlai-backend-cuda.so" ] || die "$BIN/rlai-backend-cuda.so missing"
    echo "== prebuilt programs from $BIN"
else
    if [ ! -f "$BUILD/build.ninja" ]; then
        meson setup "$BUILD" --buildtype=release $CUDA_OPT >/dev/null
    fi
    targets="tests/test_backend_ops tests/rlai-gpucheck bench/bench_spec"
    if grep -q rlai-backend-cuda "$BUILD/build.ninja"; then
        targets="$targets engine/backend-cuda/rlai-backend-cuda.so"
    elif [ $DRY = 0 ]; then
        die "$BUILD has no CUDA module (nvcc not found at setup?)"
    fi
    ninja -C "$BUILD" -j"$JOBS" $targets >/dev/null
    T_OPS=$ROOT/$BUILD/tests/test_backend_ops
    T_CHECK=$ROOT/$BUILD/tests/rlai-gpucheck
    T_SPEC=$ROOT/$BUILD/bench/bench_spec
    export RLAI_BACKEND_DIR=$ROOT/$BUILD/engine/backend-cuda
    echo "== build: $(($(date +%s) - t0)) s"
fi

status=0
if [ "$STAGE" != 2 ]; then
    if [ -f "$CARRY/model.part00" ]; then   # the first half of the model, for stage 2
        mkdir -p "$STASH"
        cp "$CARRY/model.part00" "$CARRY/model.sha256" "$CARRY/model.name" "$STASH/"
        echo "== model part 1 kept in $STASH for stage 2"
    fi
    echo "== test_backend_ops (every op, every backend present)"
    ops_status=0
    CK_DEFAULT_TIMEOUT=240 timeout 240 "$T_OPS" > "$LOG" 2>&1 || ops_status=$?
    grep -E "CUDA|%:" "$LOG" || true
    [ -n "${OUT:-}" ] && cp "$LOG" "$OUT/test_backend_ops.log"
    grep -q "100%: Checks" "$LOG" || { cat "$LOG" >&2; die "test_backend_ops failed (exit $ops_status)"; }
    if [ $DRY = 0 ] && ! grep -q "testing the CUDA backend" "$LOG"; then
        grep "CUDA" "$LOG" >&2
        die "test_backend_ops did not open the CUDA backend"
    fi
    echo "test_backend_ops: $(grep -o "100%: Checks: [0-9]*" "$LOG") ($([ $DRY = 1 ] && echo "CPU backend only" || echo "CUDA and CPU backends"))." >> "$REPORT"
fi

if [ "$STAGE" != 1 ]; then
    if [ ! -f "$MODEL" ] && [ -f "$CARRY/model.part01" ]; then
        [ -f "$STASH/model.part00" ] ||
            die "$STASH/model.part00 missing: the machine was given back after stage 1; run stage 1 again"
        MODEL=$STASH/$(cat "$STASH/model.name")
        cat "$STASH/model.part00" "$CARRY/model.part01" > "$MODEL"
        [ "$(sha256sum < "$MODEL" | cut -d' ' -f1)" = "$(cat "$STASH/model.sha256")" ] ||
            die "the joined model's SHA-256 is not the packed model's (parts from different packs?)"
        echo "== model joined: $MODEL"
    fi
    [ -f "$MODEL" ] || die "model $MODEL not found"

    echo "== rlai-gpucheck"
    dev_args=()
    [ $DRY = 1 ] && dev_args=(--cpu-only --checks-only)   # a dry run times nothing
    timeout 240 "$T_CHECK" "$MODEL" "${dev_args[@]}" | tee "$LOG" || status=$?
    [ -n "${OUT:-}" ] && cp "$LOG" "$OUT/gpucheck.log"

    echo "== bench_spec (speculative decoding, issue 14's cases, on the device)"
    spec_args=(--device cuda --reps 3)
    [ $DRY = 1 ] && spec_args=(--device cpu --reps 1 --tokens 16)
    spec_status=0
    timeout 240 "$T_SPEC" --model "$MODEL" "${spec_args[@]}" 2>/dev/null | tee "$SPEC_LOG" ||
        spec_status=$?
    [ -n "${OUT:-}" ] && cp "$SPEC_LOG" "$OUT/bench_spec.log"
    [ $spec_status = 0 ] || { echo "run.sh: bench_spec exit $spec_status" >&2; [ $status != 0 ] || status=$spec_status; }
    {
        echo "Model: $(basename "$MODEL"); release build; default mode (f16 KV)."
        echo "Checks: $(grep -c ' ok$' "$LOG") passed, $(grep -c ' FAIL$' "$LOG") failed (rlai-gpucheck exit $status)."
        echo
        grep '^|' "$LOG" || true
        echo
        echo "Speculative decoding on the device (\`bench_spec ${spec_args[*]}\`, exit $spec_status):"
        echo
        echo '```'
        awk '/^model:/ || /^greedy,/; /^per case/ { f = 1 } f && /^$/ { exit } f' "$SPEC_LOG"
        echo '```'
    } >> "$REPORT"
fi
echo "== total: $(($(date +%s) - t0)) s"

{
    echo
    echo "## $(date -u +%Y-%m-%d) — CUDA backend, $GPU (tests/gpu/run.sh, stage $STAGE)"
    echo
    cat "$REPORT"
} > "$LOG"
if [ -n "${OUT:-}" ]; then
    cp "$LOG" "$OUT/gpu-results$([ "$STAGE" = all ] || echo "-stage$STAGE").md"
    echo "== results in \$OUT"
fi
if [ $DRY = 0 ]; then
    cat "$LOG" >> bench/RESULTS.md
    echo "== appended to bench/RESULTS.md"
else
    cat "$LOG"
fi
exit $status
