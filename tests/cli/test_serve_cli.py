"""`rlai serve` from the command line: one engine per socket folder,
--plugins adding folders, and `rlai stats` (paths come from meson:
RLAI_BIN, RLAI_MODELS_DIR, RLAI_TEST_PLUGINS)."""
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

RLAI = os.environ.get("RLAI_BIN")
MODELS = Path(os.environ.get("RLAI_MODELS_DIR", "models"))
MODEL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEST_PLUGINS = os.environ.get("RLAI_TEST_PLUGINS")

pytestmark = [pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)"),
              pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched")]


class Serve:
    """`rlai serve` in its own runtime folder, without HTTP."""

    def __init__(self, tmp, *extra, wait=True):
        self.dir = Path(tmp) / "run"
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.env = dict(os.environ, XDG_RUNTIME_DIR=str(self.dir), XDG_CONFIG_HOME=str(Path(tmp) / "cfg"))
        self.env.pop("RLAI_PLUGIN_DIR", None)
        self.proc = subprocess.Popen([RLAI, "serve", "-m", str(MODEL), "-t", "2", "-c", "512", "--http", "",
                                      *extra], env=self.env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
        self.log = b""
        if wait:
            deadline = time.time() + 120
            while b"ready" not in self.log:
                line = self.proc.stderr.readline()
                assert line, self.log
                self.log += line
                assert time.time() < deadline, self.log

    def cli(self, *args, inp=None, timeout=120):
        return subprocess.run([RLAI, *args], capture_output=True, env=self.env, input=inp, timeout=timeout)

    def stop(self):
        self.proc.terminate()
        rest = self.proc.communicate(timeout=60)[1]
        self.log += rest
        return self.proc.returncode


def test_second_engine_on_the_same_socket_folder_is_refused(tmp_path):
    first = Serve(tmp_path, "--no-plugins")
    try:
        second = Serve(tmp_path, "--no-plugins", wait=False)
        err = second.proc.communicate(timeout=60)[1]
        assert second.proc.returncode == 1, err
        sock_dir = str(first.dir / "rlai")
        assert f"pid {first.proc.pid}".encode() in err and sock_dir.encode() in err, err
        assert b"already running" in err
        assert b"rlai serve: model" not in err and b"rlai serve: ready" not in err   # refused before loading
        # the first one still serves
        r = first.cli("run", "--temp", "0", "-n", "4", "Hi")
        assert r.returncode == 0 and r.stdout.strip(), r.stderr
        # kv-type belongs to the engine: refused with the reason, never in-process
        r = first.cli("run", "--kv-type", "q8_0", "-n", "4", "Hi")
        assert r.returncode == 2 and b"rlai serve --kv-type" in r.stderr, r.stderr
    finally:
        assert first.stop() == 0
    # the lock goes with the process: a new engine starts on the folder
    again = Serve(tmp_path, "--no-plugins")
    assert again.stop() == 0
    assert (first.dir / "rlai" / "engine.lock").stat().st_mode & 0o777 == 0o600


def test_stats_as_json_and_as_a_table(tmp_path):
    e = Serve(tmp_path, "--no-plugins")
    try:
        assert e.cli("run", "--temp", "0", "-n", "5", "--ignore-eos", "Hi").returncode == 0
        r = e.cli("stats", "--json")
        assert r.returncode == 0, r.stderr
        j = json.loads(r.stdout)
        assert j["requests_total"] >= 1 and j["tokens_generated"] >= 5
        assert isinstance(j["kv_blocks"], dict) and j["kv_blocks"]["total"] > 0
        r = e.cli("stats")
        assert r.returncode == 0, r.stderr
        table = r.stdout.decode()
        assert "=>" not in table and "{" not in table      # not msgpack's debug notation
        rows = dict(line.split(None, 1) for line in table.splitlines() if line.strip())
        assert int(rows["tokens_generated"]) == j["tokens_generated"]
        assert int(rows["kv_blocks.total"]) == j["kv_blocks"]["total"]
        r = e.cli("stats", "--bogus")
        assert r.returncode == 2 and b"--bogus" in r.stderr
    finally:
        assert e.stop() == 0


@pytest.mark.skipif(not TEST_PLUGINS, reason="RLAI_TEST_PLUGINS not set")
def test_plugins_flag_adds_folders(tmp_path):
    """--plugins DIR adds to the default folder (the shipped plugins next to
    the binary); --no-default-plugins leaves only the given folders."""
    def commands(*extra):
        e = Serve(tmp_path / str(len(extra)), *extra)
        try:
            r = e.cli("plugins", "--json")
            assert r.returncode == 0, r.stderr
            return {c["name"] for c in json.loads(r.stdout)["commands"]}
        finally:
            e.stop()
    default = commands()
    assert "fit.check" in default
    both = commands("--plugins", TEST_PLUGINS)
    assert default <= both and "good.echo" in both
    only = commands("--plugins", TEST_PLUGINS, "--no-default-plugins")
    assert "good.echo" in only and not (default & only)
