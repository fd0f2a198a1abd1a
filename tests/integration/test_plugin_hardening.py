"""Integration tests: misbehaving plugins inside a real `rlai serve` (the
`stuck` test plugin of tests/plugins/). Handlers that ignore cancel get
TIMEOUT at their deadline while other commands keep answering, /metrics
counts them, SIGTERM exits within shutdown_timeout_s with the sockets
removed; output no transport can carry (invalid UTF-8, NUL, too deep or too
large JSON) ends the call with an error on ZeroMQ, the pipe and HTTP alike.
Paths from meson: RLAI_BIN, RLAI_MODELS_DIR, RLAI_TEST_PLUGINS."""
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from test_daemon import Engine, ZmqClient, PipeClient, RLAI, MODEL, free_port

TEST_PLUGINS = os.environ.get("RLAI_TEST_PLUGINS")

pytestmark = [
    pytest.mark.skipif(not RLAI, reason="RLAI_BIN not set (run through meson test)"),
    pytest.mark.skipif(not MODEL.exists(), reason="default model not fetched (scripts/setup.sh)"),
    pytest.mark.skipif(not TEST_PLUGINS, reason="RLAI_TEST_PLUGINS not set (run through meson test)"),
]


def start(tmp_path, **conf):
    cfg = tmp_path / "serve.json"
    plugins = {"dir": TEST_PLUGINS, "workers": 2}
    plugins.update(conf.pop("plugins", {}))
    cfg.write_text(json.dumps({"plugins": plugins, **conf}))
    port = free_port()
    e = Engine(tmp_path, extra=("--config", str(cfg), "--http", f"127.0.0.1:{port}"))
    e.http = f"http://127.0.0.1:{port}"
    return e


def http(e, method, path, body=None, headers=None, timeout=30):
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    h = {"Content-Type": "application/json"}
    if e.key_path.exists():  # the daemon's API key (created in the test's config folder)
        h["Authorization"] = "Bearer " + e.key_path.read_text().strip()
    h.update(headers or {})
    req = urllib.request.Request(e.http + path, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def ends(c, ids, timeout):
    """Collects frames of several requests until each ended; {id: frames}."""
    out = {i: [] for i in ids}
    end = time.time() + timeout
    while any(not f or f[-1]["type"] not in ("done", "error") for f in out.values()):
        if time.time() > end:
            raise TimeoutError({i: f[-1:] for i, f in out.items()})
        f = c.recv(max(0.1, end - time.time()))
        if f.get("id") in out:
            out[f["id"]].append(f)
    return out


def test_stuck_calls_time_out_and_other_commands_still_answer(tmp_path):
    e = start(tmp_path)
    try:
        c = ZmqClient(e.zmq_ipc)
        # four calls that ignore cancel; two workers (and at most two
        # replacements). 1 and 2 run and outlast their deadline, so both
        # workers are replaced; 3 and 4 wait in the queue past a shorter
        # one and are dropped from it. (With the same deadline for all four,
        # 3 and 4 could reach the replacement workers first when the
        # watchdog's pass fell between the deadlines, and then all four
        # threads were stuck: seen once under CI load.)
        for i in range(1, 5):
            c.request("call", i, command="stuck.sleep", params='{"ms": 8000}', timeout_ms=500 if i <= 2 else 300)
        t0 = time.time()
        frames = ends(c, [1, 2, 3, 4], timeout=5)
        for i in range(1, 5):
            f = frames[i][-1]
            assert f["type"] == "error" and f["name"] == "TIMEOUT", frames[i]
            assert "stuck.sleep" in f["msg"] and ("500 ms" if i <= 2 else "300 ms") in f["msg"], f
        assert all("free plugin worker" in frames[i][-1]["msg"] for i in (3, 4))   # expired in the queue
        # another command answers at once on every transport while they are stuck
        c.request("call", 10, command="stuck.ping")
        f = ends(c, [10], timeout=3)[10]
        assert f[0]["type"] == "result" and f[0]["data"] == {"pong": True} and f[-1]["type"] == "done"
        p = PipeClient(e.sock_path)
        p.request("call", 11, command="stuck.ping")
        assert p.collect(11)[-1]["type"] == "done"
        p.close()
        st, body = http(e, "POST", "/v1/plugins/stuck.ping", {}, timeout=3)
        assert st == 200 and json.loads(body)["results"] == [{"pong": True}]
        assert time.time() - t0 < 8   # long before the handlers wake up
        # the manifest's default (stuck.short: 300 ms) and HTTP's timeout_ms
        c.request("call", 12, command="stuck.short", params='{"ms": 3000}')
        f = ends(c, [12], timeout=5)[12][-1]
        assert f["name"] == "TIMEOUT" and "300 ms" in f["msg"]
        st, body = http(e, "POST", "/v1/plugins/stuck.sleep", {"ms": 3000, "timeout_ms": 400}, timeout=5)
        err = json.loads(body)["error"]
        assert st == 504 and err["code"] == "timeout" and "400 ms" in err["message"]
        st, body = http(e, "GET", "/metrics")
        text = body.decode()
        assert 'rlai_plugin_calls_timed_out_total{command="stuck.sleep"} 5' in text
        assert 'rlai_plugin_calls_timed_out_total{command="stuck.short"} 1' in text
        stuck = [l for l in text.splitlines() if l.startswith("rlai_plugin_workers_stuck ")]
        assert stuck and int(stuck[0].split()[1]) >= 2
        c.close()
    finally:
        assert e.stop() == 0
    assert "plugin call timed out: command 'stuck.sleep'" in e.stderr


def test_a_full_plugin_queue_answers_busy_at_once(tmp_path):
    e = start(tmp_path, plugins={"workers": 1, "max_queue": 1})
    try:
        c = ZmqClient(e.zmq_ipc)
        c.request("call", 1, command="stuck.sleep", params='{"ms": 1500}')
        time.sleep(0.3)
        c.request("call", 2, command="stuck.ping")       # waits for the worker
        c.request("call", 3, command="stuck.ping")       # over plugins.max_queue
        f = ends(c, [3], timeout=1)[3][-1]
        assert f["type"] == "error" and f["name"] == "BUSY"
        frames = ends(c, [1, 2], timeout=10)
        assert frames[2][-1]["type"] == "done"
        c.close()
    finally:
        assert e.stop() == 0


def test_sigterm_with_stuck_handlers_exits_within_the_deadline(tmp_path):
    e = start(tmp_path, shutdown_timeout_s=2)
    c = ZmqClient(e.zmq_ipc)
    for i in range(1, 5):
        c.request("call", i, command="stuck.spin" if i % 2 else "stuck.sleep", params='{"ms": 60000}')
    # and one stuck over HTTP (it waits in the queue behind the two workers)
    answer = {}

    def over_http():
        try:
            answer["status"] = http(e, "POST", "/v1/plugins/stuck.sleep", {"ms": 60000}, timeout=30)[0]
        except Exception as err:   # the connection may simply close
            answer["error"] = repr(err)

    t = threading.Thread(target=over_http)
    t.start()
    time.sleep(0.5)
    assert e.sock_path.exists() and e.zmq_path.exists()
    t0 = time.time()
    e.proc.send_signal(signal.SIGTERM)
    frames = ends(c, [1, 2, 3, 4], timeout=15)
    for i in range(1, 5):
        assert frames[i][-1]["type"] == "error" and frames[i][-1]["name"] == "SHUTDOWN", frames[i]
    rc = e.stop(timeout=15)
    took = time.time() - t0
    t.join(20)
    assert not t.is_alive()
    assert answer.get("status", 503) == 503, answer
    c.close()
    assert rc == 0, e.stderr[-3000:]
    assert took < 2 + 5, took          # the deadline plus the socket teardown, not 60 s
    assert not e.sock_path.exists() and not e.zmq_path.exists()
    assert "did not stop within shutdown_timeout_s" in e.stderr


@pytest.mark.parametrize("cmd,kind,name,needle", [
    ("stuck.badtext", "utf8", "BAD_REQUEST", "not valid UTF-8"),
    ("stuck.badtext", "nul", "BAD_REQUEST", "NUL"),
    ("stuck.badjson", "deep", "TOO_LARGE", "nests deeper"),
    ("stuck.badjson", "big", "TOO_LARGE", "larger than"),
])
def test_invalid_plugin_output_is_an_error_on_every_transport(tmp_path, cmd, kind, name, needle):
    e = start(tmp_path)
    try:
        params = json.dumps({"kind": kind})
        c = ZmqClient(e.zmq_ipc)
        c.request("call", 1, command=cmd, params=params)
        zf = ends(c, [1], timeout=10)[1]
        c.close()
        p = PipeClient(e.sock_path)
        p.request("call", 1, command=cmd, params=params)
        pf = p.collect(1)
        p.close()
        for frames in (zf, pf):
            assert frames[-1]["type"] == "error", frames
            assert frames[-1]["name"] == name and needle in frames[-1]["msg"]
            assert "plugin output refused" in frames[-1]["msg"]
            assert not [f for f in frames if f["type"] == "result"]
            if cmd == "stuck.badtext":
                assert [f["text"] for f in frames if f["type"] == "token"] == ["ok "]
        st, body = http(e, "POST", "/v1/plugins/" + cmd, {"kind": kind})
        assert st == (400 if name == "BAD_REQUEST" else 413), body[:300]
        assert b"plugin output refused" in body and needle.encode() in body
        st, body = http(e, "POST", "/v1/plugins/" + cmd, {"kind": kind}, headers={"Accept": "text/event-stream"})
        events = body.decode()
        assert "plugin output refused" in events and "event: error" in events
        assert "accepted" not in events
        body.decode("utf-8")            # what went out is valid UTF-8 (raises otherwise)
        assert b"\x00" not in body and b"caf\xc3\"" not in body
        # the plugin got the error code back
        c = ZmqClient(e.zmq_ipc)
        c.request("call", 2, command="stuck.status")
        st = ends(c, [2], timeout=10)[2][0]["data"]
        assert st["last_rc"] == (-5 if name == "BAD_REQUEST" else -12)
        c.close()
    finally:
        assert e.stop() == 0


def test_unsafe_plugin_files_are_refused_at_start_and_the_engine_serves(tmp_path):
    """A group-writable entry, a world-writable folder and a FIFO named
    manifest.json (which used to hang start-up) are each refused with a log
    line naming the file; a clean copy next to them loads."""
    import shutil
    root = tmp_path / "plugins"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    for name in ("a_groupw", "b_worldw", "c_fifo", "d_ok"):
        d = root / name
        shutil.copytree(os.path.join(TEST_PLUGINS, "good"), d, ignore=shutil.ignore_patterns("*.p"))
        os.chmod(d, 0o755)
        for f in d.iterdir():
            os.chmod(f, 0o644 if f.name == "manifest.json" else 0o755)
    os.chmod(root / "a_groupw" / "libgood.so", 0o775)
    os.chmod(root / "b_worldw", 0o777)
    (root / "c_fifo" / "manifest.json").unlink()
    os.mkfifo(root / "c_fifo" / "manifest.json", 0o644)
    e = Engine(tmp_path, extra=("--plugins", str(root), "--http", ""))   # returns once serving
    try:
        c = ZmqClient(e.zmq_ipc)
        c.request("commands", 1)
        data = ends(c, [1], timeout=10)[1][0]["data"]
        assert [p["dir"].rsplit("/", 1)[-1] for p in data["plugins"]] == ["d_ok"]
        c.close()
    finally:
        assert e.stop() == 0
    log = e.stderr
    assert "a_groupw/libgood.so: refused: the file is group-writable" in log
    assert "b_worldw: refused: the folder is world-writable" in log
    assert "c_fifo/manifest.json: refused: not a regular file" in log


def test_a_result_over_the_frame_limit_is_an_error_not_a_silent_loss(tmp_path):
    e = start(tmp_path, limits={"max_frame_bytes": 4096})
    try:
        c = ZmqClient(e.zmq_ipc)
        # 4 bytes a number in the request's JSON text, 5-9 in the result's msgpack:
        # the request fits the frame limit, the echo does not
        params = json.dumps({"f": [0.5] * 850}, separators=(",", ":"))
        assert len(params) < 3900
        c.request("call", 1, command="good.echo", params=params)
        f = ends(c, [1], timeout=10)[1]
        assert [x["type"] for x in f] == ["error"], f
        assert f[-1]["name"] == "TOO_LARGE" and "transport cannot carry" in f[-1]["msg"]
        c.request("call", 2, command="good.echo", params="{}")   # still serving
        assert ends(c, [2], timeout=10)[2][-1]["type"] == "done"
        c.close()
    finally:
        assert e.stop() == 0
