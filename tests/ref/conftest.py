"""Fixtures for the reference tests: the rlai-logits tool, models, reports."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ref_model import RefModel  # noqa: E402

REAL_MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
RUN_TIMEOUT = 600
_REPORT: list[str] = []


def report(line: str) -> None:
    """Collect a measured figure; printed in pytest's terminal summary."""
    _REPORT.append(line)


def pytest_terminal_summary(terminalreporter):
    if _REPORT:
        terminalreporter.section("reference measurements")
        for line in _REPORT:
            terminalreporter.write_line(line)


class Engine:
    """Thin wrapper around the rlai-logits command line."""

    def __init__(self, exe: str, threads: int):
        self.exe = exe
        self.threads = threads

    def run(self, model, *args, check=True):
        cmd = [self.exe, str(model), *map(str, args)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} -> rc {p.returncode}\n{p.stderr[-4000:]}")
        return p

    def _opts(self, precise, isa):
        o = ["--threads", self.threads]
        if precise:
            o.append("--precise")
        if isa:
            o += ["--isa", isa]
        return o

    def logits(self, model, ids, out_dir, n_vocab, precise=True, isa=None):
        out = Path(out_dir) / f"logits-{os.getpid()}-{len(ids)}-{int(precise)}-{isa}.bin"
        self.run(model, *self._opts(precise, isa), "--tokens", " ".join(map(str, ids)), "--out", out)
        a = np.fromfile(out, dtype="<f4")
        out.unlink()
        assert a.size == len(ids) * n_vocab, \
            f"logits file has {a.size} floats, expected {len(ids)} x {n_vocab}"
        return a.reshape(len(ids), n_vocab).astype(np.float64)

    def embed(self, model, ids, out_dir, n_embd, pooling="mean", precise=True, isa=None):
        out = Path(out_dir) / f"embed-{os.getpid()}-{len(ids)}-{pooling}-{int(precise)}.bin"
        self.run(model, *self._opts(precise, isa), "--tokens", " ".join(map(str, ids)),
                 "--embed", pooling, "--out", out)
        a = np.fromfile(out, dtype="<f4")
        out.unlink()
        assert a.size == n_embd, f"embedding file has {a.size} floats, expected {n_embd}"
        return a.astype(np.float64)

    def greedy(self, model, ids, n, precise=True, isa=None):
        p = self.run(model, *self._opts(precise, isa), "--tokens", " ".join(map(str, ids)),
                     "--greedy", n)
        toks = [int(t) for t in p.stdout.split()]
        assert len(toks) == n, f"expected {n} ids, got {p.stdout!r}"
        return toks

    def tokenize(self, model, text):
        p = self.run(model, "--tokenize", text)
        return [int(t) for t in p.stdout.split()]


@pytest.fixture(scope="session")
def engine():
    exe = os.environ.get("RLAI_LOGITS")
    if not exe:
        pytest.skip("RLAI_LOGITS is not set (meson test sets it to build/tests/rlai-logits)")
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        pytest.fail(f"RLAI_LOGITS={exe} is not an executable file")
    return Engine(exe, int(os.environ.get("RLAI_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def models_dir():
    return Path(os.environ.get("RLAI_MODELS_DIR", str(HERE.parent.parent / "models")))


@pytest.fixture(scope="session")
def real_model_path(models_dir):
    p = models_dir / REAL_MODEL_NAME
    if not p.is_file():
        pytest.skip(f"real model {p} is absent (scripts/setup.sh installs it into models/)")
    return p


@pytest.fixture(scope="session")
def real_ref(real_model_path):
    return RefModel(real_model_path)


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("rlai-ref")
