#!/usr/bin/env bash
# test.sh - runs the whole test suite: unit tests (Check) and the NumPy
# reference comparison under AddressSanitizer + UBSan, then each libFuzzer
# target briefly. Installs what it needs first (scripts/setup.sh --deps).
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZ_SECONDS=${FUZZ_SECONDS:-30}

scripts/setup.sh --deps

# The reference tests run with the venv's Python.
export PATH="$PWD/.venv/bin:$PATH"

if [ ! -d build-test ]; then
    meson setup build-test -Db_sanitize=address,undefined -Db_lundef=false --buildtype=debugoptimized
fi
ninja -C build-test
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1
set +e
meson test -C build-test --print-errorlogs --num-processes 2 2>&1 | tee build-test/meson-test.out
status=${PIPESTATUS[0]}
set -e
ok=$(sed -n 's/^Ok: *\([0-9]*\).*/\1/p' build-test/meson-test.out | tail -n 1)
bad=$(sed -n 's/^Fail: *\([0-9]*\).*/\1/p' build-test/meson-test.out | tail -n 1)
timeouts=$(sed -n 's/^Timeout: *\([0-9]*\).*/\1/p' build-test/meson-test.out | tail -n 1)
if [ "$status" -ne 0 ]; then
    echo "suites: ${ok:-0} passed, $(( ${bad:-0} + ${timeouts:-0} )) failed"
    exit "$status"
fi

if [ ! -d build-fuzz ]; then
    CC=clang meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
fi
ninja -C build-fuzz
# Two fuzzers at a time (one core each): half the wall time of one by one.
run_fuzzer() {
    local fz=$1 name corpus_src work
    name=$(basename "$fz")
    corpus_src="tests/fuzz/corpus/${name#fuzz_}"
    work=$(mktemp -d)
    [ -d "$corpus_src" ] && cp -r "$corpus_src"/. "$work"/
    # -timeout: an input that takes over 10 s (a hang) is a failure too
    if ! "$fz" -max_total_time="$FUZZ_SECONDS" -timeout=10 -print_final_stats=1 "$work" >"$work.log" 2>&1; then
        echo "== $name for ${FUZZ_SECONDS}s"
        tail -n 40 "$work.log"
        echo "$name found a crash"
        return 1
    fi
    echo "== $name for ${FUZZ_SECONDS}s: $(grep -E 'stat::number_of_executed_units' "$work.log" | tr -s ' ')"
    rm -rf "$work" "$work.log"
}
pids=()
fuzz_failed=0
for fz in build-fuzz/tests/fuzz/fuzz_*; do
    [ -f "$fz" ] && [ -x "$fz" ] || continue
    run_fuzzer "$fz" &
    pids+=("$!")
    if [ "${#pids[@]}" -ge 2 ]; then
        wait "${pids[0]}" || fuzz_failed=$(( fuzz_failed + 1 ))
        pids=("${pids[@]:1}")
    fi
    ok=$(( ${ok:-0} + 1 ))
done
for p in "${pids[@]}"; do
    wait "$p" || fuzz_failed=$(( fuzz_failed + 1 ))
done
if [ "$fuzz_failed" -ne 0 ]; then
    echo "suites: $(( ${ok:-0} - fuzz_failed )) passed, $fuzz_failed failed (a fuzzer found a crash)"
    exit 1
fi
echo "suites: ${ok:-0} passed, 0 failed"
