"""Fixtures: a real `rlai serve` on the default model with private
endpoints in a temporary directory. Paths come from the environment (meson
sets them): RLAI_BIN (the rlai executable), RLAI_MODELS_DIR (the folder of
SmolLM2-135M-Instruct.Q4_1.gguf), optionally RLAI_PLUGIN_DIR (default: the
build tree's plugins/ next to RLAI_BIN's folder)."""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from rtx_localai import EngineConnectionError, RTXLocalAIClient  # noqa: E402

RLAI = os.environ.get("RLAI_BIN")
MODELS = Path(os.environ.get("RLAI_MODELS_DIR", Path(__file__).resolve().parents[3] / "models"))
MODEL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"

# The engines' API key (tcp:// endpoint): one per test session, given to
# each `rlai serve` and picked up by the SDK from RLAI_API_KEY, the way a
# user would export it.
API_KEY = secrets.token_hex(32)
os.environ["RLAI_API_KEY"] = API_KEY


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def need_engine() -> None:
    if not RLAI:
        pytest.skip("RLAI_BIN not set (run through `meson test python-sdk`)")
    if not MODEL.exists():
        pytest.skip(f"default model not fetched: {MODEL} (scripts/setup.sh)")


_HELP: Optional[str] = None


def serve_help() -> str:
    """`rlai serve --help` (to adapt to the flags this build has)."""
    global _HELP
    need_engine()
    if _HELP is None:
        r = subprocess.run([RLAI, "serve", "--help"], capture_output=True, text=True, timeout=30)
        _HELP = r.stdout + r.stderr
    return _HELP


class Engine:
    """One `rlai serve` process with its endpoints under tmp/rt/rlai/."""

    def __init__(self, tmp: Path, extra: Sequence[str] = (), ctx: int = 1024, plugins: Optional[Path] = None) -> None:
        need_engine()
        flags = serve_help()
        extra = list(extra)
        if "--http" in flags:
            extra += ["--http", ""]  # no fixed TCP port: engines of parallel tests would collide
        if plugins is not None:
            extra += ["--plugins", str(plugins)]   # adds to the shipped plugins: this folder alone
            if "--no-default-plugins" in flags:
                extra += ["--no-default-plugins"]
        elif "--no-plugins" in flags:
            extra += ["--no-plugins"]
        self.dir = Path(tmp) / "rt"
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.zmq_path = self.dir / "rlai" / "engine.zmq"
        self.sock_path = self.dir / "rlai" / "engine.sock"
        self.port = free_port()
        self.env = dict(os.environ, XDG_RUNTIME_DIR=str(self.dir), XDG_CONFIG_HOME=str(Path(tmp) / "cfg"))
        self.args: List[str] = [RLAI, "serve", "-m", str(MODEL), "-t", "2", "-c", str(ctx),
                                "--zmq-tcp", f"tcp://127.0.0.1:{self.port}", *extra]
        self.stderr_path = Path(tmp) / "serve.log"
        self._log = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(self.args, env=self.env, stdout=subprocess.DEVNULL, stderr=self._log)
        deadline = time.monotonic() + 300  # a debug/sanitizer build under load is slow
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("engine exited: " + self.log())
            if self.sock_path.exists() and self.zmq_path.exists():
                try:
                    with RTXLocalAIClient(self.ipc, connect_timeout=10):
                        return
                except EngineConnectionError:
                    pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("engine did not come up: " + self.log())

    @property
    def ipc(self) -> str:
        return f"ipc://{self.zmq_path}"

    @property
    def tcp(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def unix(self) -> str:
        return f"unix://{self.sock_path}"

    def endpoint(self, kind: str) -> str:
        return {"ipc": self.ipc, "tcp": self.tcp, "unix": self.unix}[kind]

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.stderr_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def engine(tmp_path_factory):
    """The shared engine: prompts are limited to 600 tokens."""
    e = Engine(tmp_path_factory.mktemp("engine"), extra=("--max-prompt-tokens", "600"))
    yield e
    rc = e.stop()
    assert rc == 0, e.log()


class GreedyClient(RTXLocalAIClient):
    """The client with temperature 0 unless a test sets it: the engine's
    defaults sample (docs/DEFAULTS.md), and these tests compare text."""

    def generate(self, prompt, **opts):
        opts.setdefault("temperature", 0.0)
        return super().generate(prompt, **opts)

    def stream_generate(self, prompt, **opts):
        opts.setdefault("temperature", 0.0)
        return super().stream_generate(prompt, **opts)

    def chat(self, messages, stream=False, **opts):
        opts.setdefault("temperature", 0.0)
        return super().chat(messages, stream, **opts)


@pytest.fixture()
def client(engine):
    with GreedyClient(engine.ipc, timeout=120) as c:
        yield c


@pytest.fixture()
def private_engine(tmp_path):
    """An engine of the test's own (for tests that stop or kill it)."""
    e = Engine(tmp_path)
    yield e
    if e.proc.poll() is None:
        try:
            os.kill(e.proc.pid, signal.SIGCONT)
        except OSError:
            pass
    e.stop(signal.SIGKILL)
