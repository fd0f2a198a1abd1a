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
for fz in build-fuzz/tests/fuzz/fuzz_*; do
    [ -f "$fz" ] && [ -x "$fz" ] || continue
    name=$(basename "$fz")
    corpus_src="tests/fuzz/corpus/${name#fuzz_}"
    work=$(mktemp -d)
    [ -d "$corpus_src" ] && cp -r "$corpus_src"/. "$work"/
    echo "== $name for ${FUZZ_SECONDS}s"
    if ! "$fz" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 "$work" >"$work.log" 2>&1; then
        tail -n 40 "$work.log"
        echo "$name found a crash"
        exit 1
    fi
    grep -E 'stat::number_of_executed_units|Done' "$work.log" || true
    rm -rf "$work" "$work.log"
    ok=$(( ${ok:-0} + 1 ))
done
echo "suites: ${ok:-0} passed, 0 failed"
