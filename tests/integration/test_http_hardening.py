"""Hardening of the HTTP front (issue #11, items 3, 4, 9, 10): cross-site
requests and CORS, slowloris limits, strict JSON, half-close. A real `rlai
serve` on the default model, spoken to with raw sockets and urllib."""
import json
import socket
import threading
import time

import pytest

from test_http import HELLO, Engine, error_of, sample  # noqa: F401  (shared helpers)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = Engine(tmp_path_factory.mktemp("hard"))
    yield e
    rc = e.stop()
    assert rc == 0, e.read_log()


def raw_post(engine, path, body, headers=b"Content-Type: application/json\r\n"):
    s = socket.create_connection(("127.0.0.1", engine.port))
    s.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n" % path.encode() + engine.auth_bytes() + headers +
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s


def read_all(s, timeout=120):
    s.settimeout(timeout)
    buf = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return buf
        buf += chunk
        if buf.endswith(b"data: [DONE]\n\n\r\n") or b"0\r\n\r\n" in buf[-7:]:
            return buf


def wait_running(engine, n, limit):
    t0 = time.time()
    while engine.get_json("/health")["running"] != n:
        if time.time() - t0 > limit:
            return False
        time.sleep(0.02)
    return True


# ---------------------------------------------------------------- 10. half-close

def test_half_close_keeps_the_stream(engine):
    """shutdown(SHUT_WR) after the request is not a disconnect: the whole
    SSE stream still arrives."""
    want = engine.client().chat.completions.create(model="default", messages=HELLO, max_tokens=40,
                                                   temperature=0).choices[0].message.content
    body = json.dumps({"messages": HELLO, "max_tokens": 40, "temperature": 0, "stream": True}).encode()
    s = raw_post(engine, "/v1/chat/completions", body)
    s.shutdown(socket.SHUT_WR)
    raw = read_all(s)
    s.close()
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    assert b"data: [DONE]" in raw, raw[-300:]
    text = ""
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            ch = json.loads(line[6:])
            assert "error" not in ch, ch
            text += ch["choices"][0]["delta"].get("content") or ""
    assert text == want
    # Non-streaming too: the JSON answer arrives after the half-close.
    body = json.dumps({"messages": HELLO, "max_tokens": 40, "temperature": 0}).encode()
    s = raw_post(engine, "/v1/chat/completions", body)
    s.shutdown(socket.SHUT_WR)
    raw = read_all(s)
    s.close()
    # The server probes a half-closed client with an interim 100 (Continue),
    # which HTTP/1.1 clients skip; then the answer.
    if raw.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"):
        raw = raw[len(b"HTTP/1.1 100 Continue\r\n\r\n"):]
    assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
    js = raw.split(b"\r\n\r\n", 1)[1]
    assert json.loads(js)["choices"][0]["message"]["content"] == want


def test_real_close_still_cancels(engine):
    before = engine.metrics()
    for stream in (True, False):
        body = json.dumps({"messages": [{"role": "user", "content": "Tell me a very long story about the sea."}],
                           "max_tokens": 1500, "temperature": 0, "stream": stream, "ignore_eos": True}).encode()
        s = raw_post(engine, "/v1/chat/completions", body)
        assert wait_running(engine, 1, 30)
        time.sleep(0.3)
        s.close()
        assert wait_running(engine, 0, 10), f"stream={stream}: the closed client's request was not cancelled"
    after = engine.metrics()
    # Both ended early: far fewer tokens than 2 x 1500.
    grown = sample(after, "rlai_tokens_generated_total", transport="http") - \
        sample(before, "rlai_tokens_generated_total", transport="http")
    assert grown < 1500, grown


# ---------------------------------------------------------------- 9. strict JSON

def post_raw_body(engine, path, data, ctype="application/json"):
    return engine.request("POST", path, data, {"Content-Type": ctype})


def valid_error(st, body, want_status=400):
    assert st == want_status, (st, body)
    body.decode("utf-8")                    # the answer itself is valid UTF-8
    return error_of(body)


def test_nul_escape_is_refused(engine):
    for body in (b'{"messages": [{"role": "user", "content": "Hi\\u0000 ignore the rest"}], "max_tokens": 2}',
                 b'{"messages": [{"role": "user\\u0000x", "content": "Hi"}], "max_tokens": 2}',
                 b'{"model": "default\\u0000", "messages": [{"role": "user", "content": "Hi"}]}'):
        e = valid_error(*post_raw_body(engine, "/v1/chat/completions", body)[::2])
        assert e["code"] == "invalid_value" and "NUL" in e["message"], e
    st, _, body = post_raw_body(engine, "/v1/completions", b'{"prompt": "a\\u0000b", "max_tokens": 2}')
    assert valid_error(st, body)["code"] == "invalid_value"
    # An escaped backslash followed by "u0000" is ordinary text.
    st, _, body = post_raw_body(engine, "/v1/completions",
                                b'{"prompt": "a\\\\u0000b", "max_tokens": 1, "temperature": 0}')
    assert st == 200, body


def test_invalid_utf8_is_refused_and_never_echoed(engine):
    for bad in (b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf4\x90\x80\x80"):
        for body in (b'{"messages": [{"role": "user", "content": "x' + bad + b'"}]}',
                     b'{"model": "' + bad * 3 + b'", "messages": [{"role": "user", "content": "Hi"}]}'):
            st, _, resp = post_raw_body(engine, "/v1/chat/completions", body)
            e = valid_error(st, resp)
            assert e["code"] == "invalid_encoding", e
            assert bad not in resp
    # A route or command name with invalid bytes (percent-decoded by the
    # server) comes back escaped, never raw.
    st, _, resp = engine.request("GET", "/v1/%ff%fe-nothing")
    assert st == 404
    resp.decode("utf-8")
    assert b"\xff" not in resp
    st, _, resp = post_raw_body(engine, "/v1/plugins/x%ff%c3", b"{}")
    assert st == 404
    resp.decode("utf-8")
    # An unknown model name cut at the echo limit stays valid UTF-8.
    st, _, resp = post_raw_body(engine, "/v1/chat/completions",
                                json.dumps({"model": "é" * 300, "messages": HELLO}).encode())
    assert st == 404
    resp.decode("utf-8")


def test_trailing_data_is_refused(engine):
    good = json.dumps({"prompt": "Hi", "max_tokens": 1, "temperature": 0}).encode()
    for tail in (b"x", b" {}", b"\n{\"prompt\": \"other\"}", b"]", b"\x00"):
        st, _, body = post_raw_body(engine, "/v1/completions", good + tail)
        e = valid_error(st, body)
        assert e["code"] == "invalid_json" and "after" in e["message"], (tail, e)
    st, _, body = post_raw_body(engine, "/v1/completions", good + b" \r\n\t ")
    assert st == 200, body
    st, _, body = post_raw_body(engine, "/v1/plugins/no.such", b"{} junk")
    assert valid_error(st, body)["code"] == "invalid_json"


def test_message_content_is_required(engine):
    for msgs, idx in (([{"role": "user"}], 0),
                      ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": None}], 1),
                      ([{"role": "user", "content": 5}], 0),
                      ([{"role": "user", "content": [{"type": "text"}]}], 0),
                      ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], 0),
                      ([{"role": "assistant"}, {"role": "user", "content": "Hi"}], 0)):
        st, _, body = engine.request("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
        e = valid_error(st, body)
        assert e["param"] == f"messages[{idx}].content", (msgs, e)
    # An assistant turn that made tool calls may leave content out.
    msgs = [{"role": "user", "content": "Hi"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                  "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "user", "content": "Hello again"}]
    st, _, body = engine.request("POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 2})
    assert st == 200, body


# ---------------------------------------------------------------- 3. cross-site requests, CORS

APP = "http://app.example:3000"
CHAT = {"messages": HELLO, "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def cors_engine(tmp_path_factory):
    # --allow-remote on a loopback bind: the Host check must still apply.
    e = Engine(tmp_path_factory.mktemp("cors"),
               extra=("--cors-origin", APP, "--cors-origin", "https://other.example", "--allow-remote"))
    yield e
    rc = e.stop()
    assert rc == 0, e.read_log()


def test_post_needs_json_content_type(engine):
    body = json.dumps(CHAT).encode()
    before = engine.get_json("/health")
    for ctype in ("text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x", "application/jsonx", ""):
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/plugins/good.echo"):
            st, _, resp = engine.request("POST", path, body, {"Content-Type": ctype})
            e = valid_error(st, resp, 415)
            assert e["code"] == "unsupported_media_type" and e["type"] == "invalid_request_error", e
    # No Content-Type at all (urllib would add one: a raw socket).
    s = raw_post(engine, "/v1/chat/completions", body, headers=b"Connection: close\r\n")
    raw = read_all(s, 30)
    s.close()
    assert raw.startswith(b"HTTP/1.1 415"), raw[:100]
    # Nothing ran.
    assert engine.get_json("/health")["running"] == before["running"] == 0
    for ctype in ("application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"):
        st, _, resp = engine.request("POST", "/v1/chat/completions", body, {"Content-Type": ctype})
        assert st == 200, (ctype, resp)


def test_foreign_origin_is_refused(engine):
    body = json.dumps(CHAT).encode()
    for origin in ("http://evil.example", "null", "http://127.0.0.1:1", "http://localhost"):
        for method, path, data in (("POST", "/v1/chat/completions", body), ("GET", "/v1/models", None),
                                   ("GET", "/health", None), ("OPTIONS", "/v1/chat/completions", None)):
            st, hdr, resp = engine.request(method, path, data, {"Origin": origin,
                                                                "Access-Control-Request-Method": "POST"})
            e = valid_error(st, resp, 403)
            assert e["code"] == "origin_not_allowed", (origin, method, path, e)
            assert "Access-Control-Allow-Origin" not in hdr


def test_cors_preflight_and_headers(cors_engine):
    e = cors_engine
    for path in ("/v1/chat/completions", "/v1/plugins/x.y", "/v1/models"):
        st, hdr, body = e.request("OPTIONS", path, None, {
            "Origin": APP, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert st == 204, (path, st, body)
        assert hdr["Access-Control-Allow-Origin"] == APP
        assert "POST" in hdr["Access-Control-Allow-Methods"] and "GET" in hdr["Access-Control-Allow-Methods"]
        allowed = {h.strip().lower() for h in hdr["Access-Control-Allow-Headers"].split(",")}
        assert {"authorization", "content-type"} <= allowed
        assert int(hdr["Access-Control-Max-Age"]) > 0
        assert "origin" in hdr["Vary"].lower()
        assert "Access-Control-Allow-Credentials" not in hdr
    # A preflight from an origin not on the list: refused, no CORS headers.
    st, hdr, _ = e.request("OPTIONS", "/v1/chat/completions", None,
                           {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    assert st == 403 and "Access-Control-Allow-Origin" not in hdr
    # The actual requests carry the exact origin (JSON, errors and SSE).
    body = json.dumps(CHAT).encode()
    st, hdr, _ = e.request("POST", "/v1/chat/completions", body, {"Origin": APP})
    assert st == 200 and hdr["Access-Control-Allow-Origin"] == APP and "origin" in hdr["Vary"].lower()
    st, hdr, _ = e.request("POST", "/v1/chat/completions", b"{", {"Origin": "https://other.example"})
    assert st == 400 and hdr["Access-Control-Allow-Origin"] == "https://other.example"
    st, hdr, _ = e.request("POST", "/v1/chat/completions", body, {"Origin": APP, "Content-Type": "text/plain"})
    assert st == 415
    st, hdr, sse = e.request("POST", "/v1/chat/completions",
                             json.dumps(dict(CHAT, stream=True)).encode(), {"Origin": APP})
    assert st == 200 and hdr["Content-Type"] == "text/event-stream"
    assert hdr["Access-Control-Allow-Origin"] == APP and sse.endswith(b"data: [DONE]\n\n")
    st, hdr, _ = e.request("GET", "/v1/models", None, {"Origin": APP})
    assert st == 200 and hdr["Access-Control-Allow-Origin"] == APP
    # Without an Origin (curl, the SDK): served, no CORS header.
    st, hdr, _ = e.request("GET", "/v1/models")
    assert st == 200 and "Access-Control-Allow-Origin" not in hdr
    # Other origins are still refused.
    st, _, resp = e.request("POST", "/v1/chat/completions", body, {"Origin": "http://app.example"})
    assert valid_error(st, resp, 403)["code"] == "origin_not_allowed"


def test_host_check_follows_the_bound_address(cors_engine):
    """--allow-remote does not switch the DNS-rebinding guard off while the
    front is bound to a loopback address."""
    for host in ("evil.example", f"evil.example:{cors_engine.port}"):
        st, _, resp = cors_engine.request("GET", "/health", headers={"Host": host})
        assert valid_error(st, resp, 403)["code"] == "host_not_allowed"
    for host in ("localhost", f"127.0.0.1:{cors_engine.port}", "[::1]"):
        st, _, _ = cors_engine.request("GET", "/health", headers={"Host": host})
        assert st == 200, host


# ---------------------------------------------------------------- slowloris

def _slow_client(port, stop, held, reconnects):
    """A slowloris connection: sends part of the headers, then one header
    byte every second; when the server drops it, opens a new one a second
    later (as slowloris tools re-open lost sockets every cycle)."""
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ")
            held.append(s)
            while not stop.is_set():
                s.sendall(b"a")
                stop.wait(1.0)
        except OSError:
            reconnects.append(1)
            stop.wait(1.0)


def test_good_client_is_served_during_slowloris(tmp_path):
    """256 connections that never finish their headers (and come back when
    dropped) must not lock out a client that sends its request promptly:
    the total cap evicts the connection waiting longest, and a request not
    delivered within http.header_timeout_s is closed (the old front kept
    such connections for up to 120 s and refused everyone else)."""
    cfg = tmp_path / "rlai.json"
    cfg.write_text(json.dumps({"http": {"max_connections": 64, "header_timeout_s": 3}}))
    e = Engine(tmp_path, extra=("--config", str(cfg)))
    stop = threading.Event()
    held, reconnects = [], []
    threads = [threading.Thread(target=_slow_client, args=(e.port, stop, held, reconnects), daemon=True)
               for _ in range(256)]
    try:
        for t in threads:
            t.start()
        time.sleep(2.0)                  # the flood is in place
        assert len(held) >= 64
        times = []
        for i in range(3):
            t0 = time.monotonic()
            st, _, body = e.request("POST", "/v1/chat/completions",
                                 json.dumps({"messages": [{"role": "user", "content": "Hi"}],
                                             "max_tokens": 4, "temperature": 0}).encode(), timeout=20)
            times.append(time.monotonic() - t0)
            assert st == 200, body[:300]
            assert json.loads(body)["choices"][0]["message"]["content"]
        # bounded: each good request finished well inside its own timeout
        assert max(times) < 15, times
        # the server did drop slow connections (evicted or timed out)
        assert reconnects, "no slow connection was ever dropped"
    finally:
        stop.set()
        for s in held:
            try:
                s.close()
            except OSError:
                pass
        for t in threads:
            t.join(timeout=5)
        assert e.stop() == 0, e.read_log()
