"""`rlai bench`: the table's shape (llama-bench's columns, one row per
test) and positive figures; never its timings."""
import os
import re
import subprocess
from pathlib import Path

import pytest

RLAI = os.environ.get("RLAI_BIN")
MODELS = Path(os.environ.get("RLAI_MODELS_DIR", "models"))
MODEL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"

pytestmark = [pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)"),
              pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched")]


def cells(line):
    assert line.startswith("|") and line.endswith("|"), line
    return [c.strip() for c in line[1:-1].split("|")]


def test_bench_table():
    r = subprocess.run([RLAI, "bench", "-m", str(MODEL), "-p", "16", "-n", "4", "-b", "3", "-r", "2", "-t", "2"],
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.decode().splitlines() if l.startswith("|")]
    assert cells(lines[0]) == ["model", "size", "params", "backend", "threads", "test", "t/s"]
    assert all(re.fullmatch(r"-+:?", c) for c in cells(lines[1])), lines[1]
    rows = [cells(l) for l in lines[2:]]
    assert [row[5] for row in rows] == ["pp16", "tg4", "ttft p16", "tg4 x3"]
    for row in rows:
        assert re.fullmatch(r"[\d.]+ (MiB|GiB)", row[1]) and float(row[1].split()[0]) > 50, row
        assert row[2] == "134.52 M" and row[4] == "2" and row[3].startswith("CPU"), row
        m = re.fullmatch(r"([\d.]+) ± ([\d.]+)( ms)?", row[6])
        assert m and float(m.group(1)) > 0 and float(m.group(2)) >= 0, row
        assert (m.group(3) is not None) == row[5].startswith("ttft"), row
    assert "2 repetitions" in r.stdout.decode()


def test_bench_options():
    r = subprocess.run([RLAI, "bench", "-m", str(MODEL), "-p", "0", "-n", "2", "-b", "1", "-r", "1"],
                       capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr
    tests = [cells(l)[5] for l in r.stdout.decode().splitlines() if l.startswith("|")][2:]
    assert tests == ["tg2"]
    r = subprocess.run([RLAI, "bench", "-r", "zero"], capture_output=True, timeout=60)
    assert r.returncode == 2 and b"-r: 'zero' is not an integer" in r.stderr
    r = subprocess.run([RLAI, "bench", "-m", "/nonexistent.gguf", "-r", "1"], capture_output=True, timeout=60)
    assert r.returncode == 1 and b"cannot load model" in r.stderr


def drafted(stdout):
    m = re.search(r"^speculative decoding: (\S+).*; tg runs: (\d+) tokens drafted, (\d+) accepted$",
                  stdout.decode(), re.M)
    assert m, stdout
    return m.group(1), int(m.group(2)), int(m.group(3))


def test_bench_tg_is_plain_decoding_unless_asked():
    """The engine's default (auto) drafts (the tg rows are greedy runs):
    rlai bench must turn that off itself, or its tg
    figure times prompt-lookup speculation (which llama-bench's does not).
    The same runs with --spec ngram do draft, so the zero below is not an
    artefact of the prompts."""
    args = [RLAI, "bench", "-m", str(MODEL), "-p", "0", "-n", "96", "-b", "1", "-r", "2", "-t", "2"]
    r = subprocess.run(args, capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert drafted(r.stdout) == ("off", 0, 0)
    r = subprocess.run(args + ["--spec", "ngram"], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr
    mode, d, a = drafted(r.stdout)
    assert mode == "ngram" and d > 0 and 0 <= a <= d, r.stdout
    r = subprocess.run([RLAI, "bench", "--spec", "draft", "-r", "1"], capture_output=True, timeout=60)
    assert r.returncode == 2 and b"needs a draft model" in r.stderr
    r = subprocess.run([RLAI, "bench", "--spec", "fast", "-r", "1"], capture_output=True, timeout=60)
    assert r.returncode == 2 and b"--spec must be off, ngram, draft or auto" in r.stderr
