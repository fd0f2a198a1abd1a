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


def test_unknown_commands_and_clients_without_engine(tmp_path):
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
    """--spec ngram and --spec draft (with --draft-model) give the same greedy
    answer as --spec off; draft without a draft model, self and unknown
    modes are refused with the reason, for run and serve."""
    prompt = "Repeat exactly: the silver key opens the north gate of Oakvale."
    off = run("run", "--local", "-m", str(MODEL), "--temp", "0", "--spec", "off", "-n", "24", prompt)
    on = run("run", "--local", "-m", str(MODEL), "--temp", "0", "--spec", "ngram", "--spec-max-draft", "4", "-n", "24", prompt)
    assert off.returncode == 0 and on.returncode == 0, (off.stderr, on.stderr)
    assert on.stdout == off.stdout
    # the metrics line says what was drafted, only when something was
    m = re.search(rb"\| drafted (\d+), accepted (\d+) \((\d+)%\) \|", on.stderr.splitlines()[-1])
    assert m and 0 < int(m.group(2)) <= int(m.group(1)), on.stderr
    assert int(m.group(3)) == round(100 * int(m.group(2)) / int(m.group(1))), on.stderr
    assert b"drafted" not in off.stderr, off.stderr
    r = run("run", "--local", "-m", str(MODEL), "--spec", "draft", "-n", "4", "Hi")
    assert r.returncode == 2 and b"--spec draft needs a draft model" in r.stderr, r.stderr
    r = run("run", "--local", "-m", str(MODEL), "--spec", "self", "-n", "4", "Hi")
    assert r.returncode == 2 and b"not implemented" in r.stderr, r.stderr
    r = run("run", "--local", "-m", str(MODEL), "--spec", "fast", "-n", "4", "Hi")
    assert r.returncode == 2 and b"--spec must be off, ngram, draft or auto" in r.stderr, r.stderr
    # the default model drafting for itself: the same greedy answer, the draft named by `info`
    dr = run("run", "--local", "-m", str(MODEL), "--draft-model", str(MODEL), "--temp", "0", "--spec", "draft", "-n", "24", prompt)
    assert dr.returncode == 0 and dr.stdout == off.stdout, dr.stderr
    r = run("info", "-m", str(MODEL), "--draft-model", str(MODEL))
    assert r.returncode == 0 and b"draft      " in r.stdout, r.stdout
    r = run("run", "--draft-model", str(MODEL), "-n", "4", "Hi")
    assert r.returncode == 2 and b"--draft-model applies to an in-process model" in r.stderr, r.stderr
    r = run("serve", "-m", str(MODEL), "--spec", "self")
    assert r.returncode == 2 and b"not implemented" in r.stderr, r.stderr
    r = run("serve", "-m", str(MODEL), "--spec-max-draft", "17")
    assert r.returncode == 2
    r = run("serve", "-m", str(MODEL), "--spec-lookup-min", "9")
    assert r.returncode == 2 and b"--spec-lookup-min" in r.stderr and b"[-1, 8]" in r.stderr, r.stderr


def test_version_in_one_place():
    """meson.build's version reaches rlai --version; the Python SDK's two
    copies must agree with it (they cannot read meson at import time)."""
    root = Path(__file__).resolve().parents[2]
    want = re.search(r"version\s*:\s*'([^']+)'", (root / "meson.build").read_text()).group(1)
    r = run("--version")
    assert r.returncode == 0 and r.stdout.decode().startswith(f"rlai {want} "), r.stdout
    sdk = root / "sdk" / "python"
    assert re.search(r'^version = "([^"]+)"', (sdk / "pyproject.toml").read_text(), re.M).group(1) == want
    assert re.search(r'^__version__ = "([^"]+)"', (sdk / "rtx_localai" / "__init__.py").read_text(),
                     re.M).group(1) == want


# ---------------------------------------------------------------- options

SUBCOMMANDS = ["serve", "run", "chat", "stats", "tokenize", "info", "call", "plugins", "fit", "gassist",
               "bench"]


@pytest.mark.parametrize("cmd", SUBCOMMANDS)
def test_every_subcommand_has_help(cmd):
    r = run(cmd, "--help", timeout=30)
    assert r.returncode == 0, (cmd, r.stderr)
    assert r.stdout.decode().startswith(f"usage: rlai {cmd}"), (cmd, r.stdout[:200])


def no_engine_env(tmp_path):
    """An environment where no engine runs (a fresh runtime folder)."""
    d = tmp_path / "run"
    d.mkdir(mode=0o700, exist_ok=True)
    return dict(os.environ, XDG_RUNTIME_DIR=str(d))


@pytest.mark.parametrize("args,msg", [
    (("--temp", "abc"), b"--temp: 'abc' is not a number"),
    (("--top-p", "x1"), b"--top-p: 'x1' is not a number"),
    (("--top-k", "3.5"), b"--top-k: '3.5' is not an integer"),
    (("--max-tokens", "many"), b"--max-tokens: 'many' is not an integer"),
    (("-n", "0"), b"-n: 0 is out of range"),
    (("--seed", "-3"), b"--seed: '-3' is not a non-negative integer"),
    (("--kv-type", "q4"), b"--kv-type: 'q4' is not one of f16, q8_0"),
])
def test_bad_value_names_the_option(tmp_path, args, msg):
    r = subprocess.run([RLAI, "run", *args, "hi"], capture_output=True, env=no_engine_env(tmp_path), timeout=30)
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr, r.stderr


def test_serve_bad_value_names_the_option():
    r = run("serve", "--threads", "x", timeout=30)
    assert r.returncode == 2 and b"--threads: 'x' is not an integer" in r.stderr, r.stderr
    r = run("serve", "--max-connections", "0", timeout=30)
    assert r.returncode == 2 and b"--max-connections: 0 is out of range" in r.stderr, r.stderr


def limits():
    """The shared ranges, read from the header both http.c and main.c use."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "host" / "sampling_limits.h").read_text()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"#define RLAI_LIM_(\w+) \(?(-?[\d.]+)\)?", text)}


@pytest.mark.parametrize("opt,key", [("--temp", "TEMPERATURE"), ("--top-p", "TOP_P"), ("--min-p", "MIN_P"),
                                     ("--repeat-penalty", "REPEAT_PENALTY"), ("--top-k", "TOP_K"),
                                     ("--spec-max-draft", "SPEC_MAX_DRAFT")])
def test_ranges_are_the_http_ranges(tmp_path, opt, key):
    """The CLI takes exactly the range HTTP takes (host/sampling_limits.h):
    the ends are accepted (then no engine answers: exit 1), one step past
    either end is refused naming the option (exit 2)."""
    lim = limits()
    lo, hi = lim[key + "_MIN"], lim[key + "_MAX"]
    integer = key in ("TOP_K", "SPEC_MAX_DRAFT")
    fmt = (lambda v: str(int(v))) if integer else (lambda v: repr(v))
    step = 1 if integer else 0.01
    env = no_engine_env(tmp_path)
    for v in (lo, hi):
        r = subprocess.run([RLAI, "run", opt, fmt(v), "hi"], capture_output=True, env=env, timeout=30)
        assert r.returncode == 1 and b"engine" in r.stderr, (opt, v, r.stderr)
    for v in (lo - step, hi + step):
        r = subprocess.run([RLAI, "run", opt, fmt(v), "hi"], capture_output=True, env=env, timeout=30)
        assert r.returncode == 2, (opt, v, r.stderr)
        assert f"{opt}: ".encode() in r.stderr and b"out of range" in r.stderr, r.stderr
    # http.c takes its ranges from the same header (no literal of its own)
    root = Path(__file__).resolve().parents[2]
    http = (root / "host" / "http.c").read_text()
    assert '#include "sampling_limits.h"' in http
    assert f"RLAI_LIM_{key}_MAX" in http


def test_engine_options_are_not_a_silent_switch_to_in_process(tmp_path):
    """--kv-type (and --isa, --precise) belong to an in-process engine:
    without --local they are refused, not a quiet change of mode."""
    env = no_engine_env(tmp_path)
    for args in (("--kv-type", "q8_0"), ("--isa", "scalar"), ("--precise",)):
        r = subprocess.run([RLAI, "run", *args, "hi"], capture_output=True, env=env, timeout=30)
        assert r.returncode == 2, (args, r.stderr)
        assert b"applies to an in-process model: add --local" in r.stderr, r.stderr
        assert b"cannot load model" not in r.stderr
    r = run("run", "--local", "-m", str(MODEL), "--kv-type", "q8_0", "--temp", "0", "-n", "4", "Hi")
    assert r.returncode == 0, r.stderr


@pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched")
def test_prompt_from_stdin():
    """`rlai run -` and piped stdin give the answer the argument gives."""
    q = "What is the capital of France?"
    base = ["run", "--local", "-m", str(MODEL), "--temp", "0", "-n", "12"]
    arg = run(*base, q)
    dash = subprocess.run([RLAI, *base, "-"], input=(q + "\n").encode(), capture_output=True, timeout=600)
    piped = subprocess.run([RLAI, *base], input=q.encode(), capture_output=True, timeout=600)
    assert arg.returncode == dash.returncode == piped.returncode == 0, (dash.stderr, piped.stderr)
    assert arg.stdout.strip() and dash.stdout == arg.stdout and piped.stdout == arg.stdout
    empty = subprocess.run([RLAI, *base, "-"], input=b"", capture_output=True, timeout=60)
    assert empty.returncode == 2 and b"empty" in empty.stderr


@pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched")
def test_metrics_line_starts_on_its_own_line():
    """Text and metrics on one stream (a terminal shows both): the metrics
    line begins a line even when the answer stops mid-line, and the answer
    is not followed by a blank line."""
    r = subprocess.run([RLAI, "run", "--local", "-m", str(MODEL), "--temp", "0", "-n", "3", "Tell me a story."],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert r.returncode == 0, r.stdout
    out = r.stdout.decode()
    i = out.index("[prompt ")
    assert out[i - 1] == "\n" and out[i - 2] != "\n", repr(out)
