"""End-to-end tests of the `rlai` command line (paths come from meson:
RLAI_BIN, RLAI_MODELS_DIR, RLAI_TESTDATA)."""
import os
import re
import subprocess
from pathlib import Path

import pytest

RLAI = os.environ.get("RLAI_BIN")
MODELS = Path(os.environ.get("RLAI_MODELS_DIR", "models"))
TESTDATA = Path(os.environ.get("RLAI_TESTDATA", Path(__file__).resolve().parents[1] / "data"))
MODEL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)")


def run(*args, timeout=600):
    return subprocess.run([RLAI, *args], capture_output=True, timeout=timeout)


def vectors(name):
    inp = (TESTDATA / "tokenizer" / f"{name}.inp").read_text(encoding="utf-8")
    out = (TESTDATA / "tokenizer" / f"{name}.out").read_text(encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":
        texts.pop()  # the file ends with a separator
    ids = out.split("\n")
    if ids and ids[-1] == "":
        ids.pop()
    return texts, ids


@pytest.mark.parametrize("name", ["ggml-vocab-starcoder.gguf", "ggml-vocab-gpt-2.gguf"])
def test_tokenize_command_matches_vectors(name):
    texts, ids = vectors(name)
    assert len(texts) == len(ids) > 30
    checked = 0
    for text, expected in zip(texts, ids):
        if text.startswith("-") or "\x00" in text:
            continue  # not passable as a plain argv string
        r = run("tokenize", "-m", str(TESTDATA / "tokenizer" / name), text)
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().strip() == expected.strip(), repr(text)
        checked += 1
    assert checked > 30


def test_tokenize_command_bad_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 10)
    r = run("tokenize", "-m", str(bad), "hi")
    assert r.returncode == 1
    assert b"truncated" in r.stderr or b"gguf" in r.stderr


@pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched")
def test_run_streams_answer_and_metrics():
    r = run("run", "--local", "-m", str(MODEL), "-n", "24", "What is the capital of France?")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.decode().strip()) > 0
    line = r.stderr.decode().strip().splitlines()[-1]
    m = re.search(r"prompt (\d+) tok \| TTFT ([\d.]+) ms \| prefill ([\d.]+) tok/s \| decode ([\d.]+) tok/s", line)
    assert m, line
    assert int(m.group(1)) > 20 and float(m.group(2)) > 0 and float(m.group(3)) > 0


@pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched")
def test_info_command():
    r = run("info", "-m", str(MODEL))
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode()
    assert "layers 30" in out and "vocab 49152" in out and "134515008" in out


def test_missing_model_is_a_clear_error(tmp_path):
    r = run("run", "--local", "-m", str(tmp_path / "nope.gguf"), "hi")
    assert r.returncode == 1
    assert b"nope.gguf" in r.stderr and b"cannot load model" in r.stderr


def test_unimplemented_and_unknown_commands(tmp_path):
    r = run("bench")
    assert r.returncode == 2 and b"not implemented" in r.stderr
    # plugins and call are clients: with no engine running they say so
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    for args in (("plugins",), ("call", "fit.gpus")):
        r = subprocess.run([RLAI, *args], capture_output=True, env=env, timeout=30)
        assert r.returncode == 1 and b"engine" in r.stderr.lower(), (args, r.stderr)
    r = run("call")
    assert r.returncode == 2 and b"usage: rlai call" in r.stderr
    r = run("frobnicate")
    assert r.returncode == 2 and b"unknown command" in r.stderr


def test_device_selection():
    """--device picks the backend: cpu runs, cuda without the CUDA backend
    module is a clear refusal (never a silent CPU run), a bad name is named,
    and --device without --local is refused instead of switching modes."""
    r = run("info", "-m", str(MODEL), "--device", "cpu")
    assert r.returncode == 0, r.stderr
    assert re.search(rb"^device\s+cpu$", r.stdout, re.M), r.stdout
    r = run("run", "--local", "-m", str(MODEL), "--device", "cpu", "-n", "4", "Hi")
    assert r.returncode == 0, r.stderr
    if not Path("/dev/nvidiactl").exists():
        # Without a GPU: refused with the reason (module missing, or no driver).
        r = run("run", "--local", "-m", str(MODEL), "--device", "cuda", "-n", "4", "Hi")
        assert r.returncode != 0
        assert b"CUDA backend: " in r.stderr, r.stderr
        assert (b"rlai-backend-cuda.so not found" in r.stderr or b"no usable CUDA driver" in r.stderr), r.stderr
    r = run("run", "--local", "-m", str(MODEL), "--device", "gpu", "-n", "4", "Hi")
    assert r.returncode != 0
    assert b"'gpu' is not one of auto, cpu, cuda, cuda:N" in r.stderr, r.stderr
    r = run("run", "--device", "cpu", "Hi")
    assert r.returncode == 2
    assert b"--device applies to an in-process model" in r.stderr


def test_spec_flag():
    """--spec ngram gives the same greedy answer as --spec off; draft/self
    and unknown modes are refused with the reason, for run and serve."""
    prompt = "Repeat exactly: the silver key opens the north gate of Oakvale."
    off = run("run", "--local", "-m", str(MODEL), "--spec", "off", "-n", "24", prompt)
    on = run("run", "--local", "-m", str(MODEL), "--spec", "ngram", "--spec-max-draft", "4", "-n", "24", prompt)
    assert off.returncode == 0 and on.returncode == 0, (off.stderr, on.stderr)
    assert on.stdout == off.stdout
    r = run("run", "--local", "-m", str(MODEL), "--spec", "draft", "-n", "4", "Hi")
    assert r.returncode == 2 and b"not implemented" in r.stderr, r.stderr
    r = run("run", "--local", "-m", str(MODEL), "--spec", "fast", "-n", "4", "Hi")
    assert r.returncode == 2 and b"--spec must be off, ngram or auto" in r.stderr, r.stderr
    r = run("serve", "-m", str(MODEL), "--spec", "self")
    assert r.returncode == 2 and b"not implemented" in r.stderr, r.stderr
    r = run("serve", "-m", str(MODEL), "--spec-max-draft", "17")
    assert r.returncode == 2


def test_version_in_one_place():
    """meson.build's version reaches rlai --version; the Python SDK's two
    copies must agree with it (they cannot read meson at import time)."""
    root = Path(__file__).resolve().parents[2]
    want = re.search(r"version\s*:\s*'([^']+)'", (root / "meson.build").read_text()).group(1)
    r = run("--version")
    assert r.returncode == 0 and r.stdout.decode().startswith(f"rlai {want} "), r.stdout
    sdk = root / "samples" / "python"
    assert re.search(r'^version = "([^"]+)"', (sdk / "pyproject.toml").read_text(), re.M).group(1) == want
    assert re.search(r'^__version__ = "([^"]+)"', (sdk / "rtx_localai" / "__init__.py").read_text(),
                     re.M).group(1) == want
