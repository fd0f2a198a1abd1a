"""API key of the network endpoints (HTTP and --zmq-tcp) against a real
`rlai serve`: 401 without or with a wrong key, the key file created 0600
on first start and reused, insecure key files refused at start, --no-auth,
ZeroMQ PLAIN on tcp:// while ipc:// and the pipe stay keyless. Paths come
from meson (RLAI_BIN, RLAI_MODELS_DIR)."""
import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import msgpack
import pytest
import zmq

openai = pytest.importorskip("openai")

from test_daemon import Engine as ZmqEngine, PipeClient, ZmqClient  # noqa: E402
from test_http import RLAI, MODEL, Engine as HttpEngine, free_port  # noqa: E402

pytestmark = pytest.mark.skipif(not RLAI or not MODEL.exists(), reason="needs RLAI_BIN and the default model")

HELLO = [{"role": "user", "content": "Say hi."}]


def assert_401(st, body):
    assert st == 401, (st, body)
    e = json.loads(body)["error"]
    assert e["type"] == "invalid_request_error" and e["code"] == "invalid_api_key" and e["message"], e


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = HttpEngine(tmp_path_factory.mktemp("auth"))
    yield e
    assert e.stop() == 0


def test_key_file_created_private(engine):
    st = engine.key_path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert stat.S_IMODE(engine.key_path.parent.stat().st_mode) == 0o700
    key = engine.api_key
    assert len(key) == 64 and all(c in "0123456789abcdef" for c in key)
    log = engine.read_log()
    assert str(engine.key_path) in log and key not in log  # where it is, never the key itself


def test_http_refuses_without_or_with_a_wrong_key(engine):
    for path in ("/v1/models", "/metrics", "/v1/plugins"):
        assert_401(*engine.request("GET", path, auth=False)[::2])
        assert_401(*engine.request("GET", path, headers={"Authorization": "Bearer wrong"}, auth=False)[::2])
        assert_401(*engine.request("GET", path, headers={"Authorization": engine.api_key}, auth=False)[::2])
    body = {"messages": HELLO, "max_tokens": 2}
    st, hdr, out = engine.request("POST", "/v1/chat/completions", body, headers={"Content-Type": "application/json"},
                                  auth=False)
    assert_401(st, out)
    assert hdr.get("WWW-Authenticate", "").startswith("Bearer")
    # a key one character off
    k = engine.api_key
    bad = k[:-1] + ("0" if k[-1] != "0" else "1")
    assert_401(*engine.request("GET", "/v1/models", headers={"Authorization": f"Bearer {bad}"}, auth=False)[::2])
    # liveness stays open, and so does a CORS preflight
    st, _, _ = engine.request("GET", "/health", auth=False)
    assert st == 200
    st, _, _ = engine.request("OPTIONS", "/v1/chat/completions", auth=False)
    assert st != 401
    # with the key: served
    st, _, out = engine.request("GET", "/v1/models")
    assert st == 200 and json.loads(out)["data"]


def test_openai_package_with_the_key(engine, monkeypatch):
    c = openai.OpenAI(api_key=engine.api_key, base_url=engine.base + "/v1", max_retries=0, timeout=300)
    r = c.chat.completions.create(model="default", messages=HELLO, max_tokens=3, temperature=0)
    assert r.usage.completion_tokens >= 1
    # OPENAI_API_KEY, as docs/SERVE.md says
    monkeypatch.setenv("OPENAI_API_KEY", engine.api_key)
    c = openai.OpenAI(base_url=engine.base + "/v1", max_retries=0, timeout=300)
    assert c.models.list().data
    c = openai.OpenAI(api_key="sk-wrong", base_url=engine.base + "/v1", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as ei:
        c.models.list()
    assert ei.value.status_code == 401 and ei.value.body["code"] == "invalid_api_key"


@pytest.mark.skipif(not shutil.which("curl"), reason="curl not installed")
def test_curl_with_and_without_the_key(engine):
    body = json.dumps({"messages": HELLO, "max_tokens": 2, "temperature": 0})
    args = ["curl", "-s", "-w", "\n%{http_code}", "-H", "Content-Type: application/json", "-d", body,
            engine.base + "/v1/chat/completions"]
    out = subprocess.run(args, capture_output=True, timeout=120).stdout.decode()
    assert out.endswith("\n401") and "invalid_api_key" in out, out
    out = subprocess.run(args[:1] + ["-H", f"Authorization: Bearer {engine.api_key}"] + args[1:],
                         capture_output=True, timeout=120).stdout.decode()
    assert out.endswith("\n200") and "chat.completion" in out, out


def test_key_file_reused_on_second_start(tmp_path):
    e = HttpEngine(tmp_path)
    key = e.api_key
    log1 = e.read_log()
    assert e.stop() == 0
    assert "created in" in log1
    e = HttpEngine(tmp_path)
    try:
        assert e.api_key == key
        assert "read from" in e.read_log()
        st, _, _ = e.request("GET", "/v1/models")
        assert st == 200
    finally:
        assert e.stop() == 0


def serve_fails(tmp_path, *extra, env_extra=None):
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700, exist_ok=True)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(rt), XDG_CONFIG_HOME=str(tmp_path / "cfg"), **(env_extra or {}))
    env.pop("RLAI_API_KEY", None)
    r = subprocess.run([RLAI, "serve", "-m", str(MODEL), "-t", "1", "--no-plugins",
                        "--http", f"127.0.0.1:{free_port()}", *extra], env=env, capture_output=True, timeout=120)
    return r.returncode, r.stderr.decode(errors="replace")


def test_insecure_key_file_refused(tmp_path):
    kf = tmp_path / "key"
    kf.write_text("a" * 64 + "\n")
    os.chmod(kf, 0o644)
    rc, err = serve_fails(tmp_path, "--api-key-file", str(kf))
    assert rc == 1 and str(kf) in err and "0644" in err and "chmod 600" in err, err
    # a symlink to a good file
    os.chmod(kf, 0o600)
    link = tmp_path / "link"
    link.symlink_to(kf)
    rc, err = serve_fails(tmp_path, "--api-key-file", str(link))
    assert rc == 1 and str(link) in err and "symbolic link" in err, err
    # not a regular file
    d = tmp_path / "dir"
    d.mkdir(mode=0o700)
    rc, err = serve_fails(tmp_path, "--api-key-file", str(d))
    assert rc == 1 and "not a regular file" in err, err
    # the default key file, group-readable
    dflt = tmp_path / "cfg" / "rlai" / "api_key"
    dflt.parent.mkdir(parents=True)
    dflt.write_text("b" * 64)
    os.chmod(dflt, 0o640)
    rc, err = serve_fails(tmp_path)
    assert rc == 1 and str(dflt) in err and "0640" in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the key file to another user")
def test_key_file_of_another_user_refused(tmp_path):
    kf = tmp_path / "key"
    kf.write_text("c" * 64)
    os.chmod(kf, 0o600)
    os.chown(kf, 65534, 65534)
    rc, err = serve_fails(tmp_path, "--api-key-file", str(kf))
    assert rc == 1 and str(kf) in err and "owned by uid 65534" in err, err


def test_no_auth_turns_it_off(tmp_path):
    e = HttpEngine(tmp_path, extra=("--no-auth",))
    try:
        st, _, out = e.request("GET", "/v1/models")
        assert st == 200
        assert "--no-auth" in e.read_log()
        assert not e.key_path.exists()
    finally:
        assert e.stop() == 0


def test_config_api_key(tmp_path):
    conf = tmp_path / "serve.json"
    conf.write_text(json.dumps({"auth": {"api_key": "from-the-config-0123"}}))
    e = HttpEngine(tmp_path, extra=("--config", str(conf)))
    try:
        assert not e.key_path.exists()
        st, _, _ = e.request("GET", "/v1/models", headers={"Authorization": "Bearer from-the-config-0123"},
                             auth=False)
        assert st == 200
        assert_401(*e.request("GET", "/v1/models", auth=False)[::2])
        assert "from-the-config-0123" not in e.read_log()
    finally:
        assert e.stop() == 0
    conf.write_text(json.dumps({"auth": {"enabled": "yes"}}))
    rc, err = serve_fails(tmp_path, "--config", str(conf))
    assert rc == 2 and "auth.enabled" in err


# ---------------------------------------------------------------- ZeroMQ tcp://

def hello_answered(c, timeout=3):
    """True when the hello's done frame arrives (after its result frame)."""
    c.request("hello", 1)
    end = time.time() + timeout
    while time.time() < end:
        try:
            f = c.recv(max(0.1, end - time.time()))
        except TimeoutError:
            return False
        if f["id"] == 1 and f["type"] in ("done", "error"):
            return f["type"] == "done"
    return False


def test_zmq_tcp_needs_the_key_ipc_and_pipe_do_not(tmp_path):
    e = ZmqEngine(tmp_path)
    try:
        tcp = f"tcp://127.0.0.1:{e.port}"
        assert stat.S_IMODE(e.key_path.stat().st_mode) == 0o600
        for key in (None, "wrong"):
            c = ZmqClient(tcp, api_key=key)
            assert not hello_answered(c), key
            c.s.close()
        c = ZmqClient(tcp, api_key=e.api_key)
        assert hello_answered(c, 30)
        c.s.close()
        # pyzmq's own option names, as docs/SERVE.md shows them
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.linger = 0
        s.plain_username = b"rlai"
        s.plain_password = e.api_key.encode()
        s.connect(tcp)
        s.send(msgpack.packb({"v": 1, "id": 7, "type": "hello"}))
        assert s.poll(30000) and msgpack.unpackb(s.recv())["id"] == 7  # the hello's first frame
        s.close()
        # keyless: the 0700-directory endpoints
        c = ZmqClient(e.zmq_ipc)
        assert hello_answered(c, 30)
        c.s.close()
        p = PipeClient(e.sock_path)
        p.request("hello", 1)
        assert p.collect(1, timeout=30)[-1]["type"] == "done"
        p.close()
        # the rlai CLI: the key file, RLAI_API_KEY, or a clear refusal
        env = dict(e.env)
        r = subprocess.run([RLAI, "stats", "--endpoint", tcp], env=env, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        env2 = dict(env, XDG_CONFIG_HOME=str(tmp_path / "nowhere"), RLAI_API_KEY=e.api_key)
        r = subprocess.run([RLAI, "stats", "--endpoint", tcp], env=env2, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        env2.pop("RLAI_API_KEY")
        r = subprocess.run([RLAI, "stats", "--endpoint", tcp], env=env2, capture_output=True, timeout=60)
        assert r.returncode == 1 and b"requires an API key" in r.stderr, r.stderr
        env2["RLAI_API_KEY"] = "wrong"
        r = subprocess.run([RLAI, "stats", "--endpoint", tcp], env=env2, capture_output=True, timeout=60)
        assert r.returncode == 1 and b"refused the API key" in r.stderr, r.stderr
        # the ipc endpoint needs no key at all
        env2.pop("RLAI_API_KEY")
        r = subprocess.run([RLAI, "stats", "--endpoint", e.zmq_ipc], env=env2, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
    finally:
        assert e.stop() == 0


def test_zmq_tcp_no_auth(tmp_path):
    e = ZmqEngine(tmp_path, extra=("--no-auth",))
    try:
        c = ZmqClient(f"tcp://127.0.0.1:{e.port}")
        assert hello_answered(c, 30)
        c.s.close()
    finally:
        assert e.stop() == 0
